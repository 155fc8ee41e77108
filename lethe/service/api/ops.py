"""Health, readiness and Prometheus metrics."""
from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from lethe.service.api.auth import Principal, is_operator, principal
from lethe.service.domain.errors import Problem
from lethe.service.infra.db import INJECTED, session_scope, transactional
from lethe.service.infra.queue import broker_reachable, queue_depth
from lethe.service.infra.tables import JOB_STATES, Job

router = APIRouter(tags=["operations"])
# Set by the embedded mode (lethe.embedded.WorkerSupervisor): /readyz then reports its worker process.
class WorkerWatch(Protocol):
    def alive(self) -> bool: ...


worker_supervisor: WorkerWatch | None = None
REGISTRY = CollectorRegistry()
REQUEST_LATENCY = Histogram("lethe_http_request_duration_seconds", "HTTP request latency",
                            ["method", "route", "status"], registry=REGISTRY,
                            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
DURATION_BUCKETS = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, float("inf"))


class JobCollector:
    """Jobs by state, job durations and queue depth, read from the database and broker at scrape time."""

    def collect(self):
        with session_scope() as session:
            counts = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
            ended = session.execute(select(Job.state, Job.started_at, Job.ended_at)
                                    .where(Job.ended_at.is_not(None), Job.started_at.is_not(None))
                                    .order_by(Job.ended_at.desc()).limit(10_000)).all()
        by_state = GaugeMetricFamily("lethe_jobs", "Jobs by state", labels=["state"])
        for state in JOB_STATES:
            by_state.add_metric([state], counts.get(state, 0))
        yield by_state
        durations = HistogramMetricFamily("lethe_job_duration_seconds", "Run time of ended jobs (latest 10k)",
                                          labels=["state"])
        for state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            seconds = [(e - s).total_seconds() for st, s, e in ended if st == state and s and e]
            buckets = [(str(b), sum(1 for x in seconds if x <= b)) for b in DURATION_BUCKETS]
            durations.add_metric([state], buckets, sum(seconds))
        yield durations
        depth = queue_depth()
        if depth is not None:
            yield GaugeMetricFamily("lethe_queue_depth", "Messages waiting in the job queue", value=depth)


REGISTRY.register(JobCollector())


@router.get("/healthz")
def healthz():
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
@transactional
def readyz(session: Session = INJECTED):
    """Readiness: the database and the broker answer (and, in embedded mode, the worker process lives)."""
    checks = {}
    try:
        session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    checks["broker"] = "ok" if broker_reachable() else "unreachable"
    if worker_supervisor is not None:  # `make run`: its own worker process, restarted when it dies
        checks["worker"] = "ok" if worker_supervisor.alive() else "restarting"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks},
                        status_code=200 if ready else 503)


@router.get("/metrics")
def metrics(who: Principal = Depends(principal)):
    """Every tenant's job counts: for the operator and its scraper (a metrics:read key, which only the
    operator mints), not for tenants, whose admin keys hold every other scope."""
    if not (is_operator(who) or "metrics:read" in who.scopes):
        raise Problem(403, "forbidden", "Forbidden", "/metrics needs the operator's key or a metrics:read key")
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def observe(method: str, route: str, status: int, seconds: float) -> None:
    REQUEST_LATENCY.labels(method, route, str(status)).observe(seconds)
