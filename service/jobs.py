"""Unlearning jobs in the database: creation, views, cancellation, and the lease that makes delivery
at-least-once without a double run (SPEC section 9)."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, object_session

from service import audit_log
from service.models import TERMINAL, Job, utcnow
from service.problems import Problem, not_found


def canonical_sha256(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode()).hexdigest()


def forget_evidence(records: list[dict]) -> dict:
    """What stays of the erased data: the count, each record's sha256 (and its given secrets', one by one),
    and the set's manifest hash."""
    hashes = [{"id": r["id"], "sha256": canonical_sha256(r),
               **({"secrets_sha256": [canonical_sha256(x) for x in r["secrets"]]} if r.get("secrets") else {})}
              for r in records]
    return {"count": len(records), "records": hashes, "manifest_sha256": canonical_sha256(hashes)}


def get_job(session: Session, tenant: str, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.tenant != tenant:
        raise not_found(f"job {job_id!r}")
    return job


def job_view(job: Job) -> dict:
    progress = dict(job.progress or {})
    progress["heartbeat_at"] = job.heartbeat_at
    return {
        "id": job.id, "kind": job.kind, "state": job.state, "request_id": job.request_id, "model_id": job.model_id,
        "base_version": job.base_version, "method": job.method, "progress": progress, "attempt": job.attempt,
        "created_at": job.created_at, "started_at": job.started_at, "ended_at": job.ended_at,
        "error": job.error, "result": job.result,
        "forget": {k: job.forget_evidence[k] for k in ("count", "manifest_sha256")},
    }


def end_job(job: Job, state: str, *, error: dict | None = None, result: dict | None = None) -> None:
    """A terminal state: the raw forget records go, their evidence stays."""
    job.state, job.ended_at = state, utcnow()
    job.forget_records = None
    job.lease_owner, job.lease_expires_at = None, None
    if error is not None:
        job.error = error
    if result is not None:
        job.result = result
    log_state(job, {"error": error["detail"]} if error else {"result": result})


def log_state(job: Job, data: dict | None = None) -> None:
    """Every job state change goes into the audit log, in the transaction that makes it."""
    audit_log.append(object_session(job), job.tenant, f"job.{job.state.lower()}", job.id,
                     {"request_id": job.request_id, "model_id": job.model_id, "attempt": job.attempt, **(data or {})})


def request_cancel(session: Session, job: Job) -> Job:
    if job.state in TERMINAL:
        raise Problem(409, "job-terminal", "Job already ended", f"job {job.id} is {job.state}")
    job.cancel_requested = True
    if job.state == "QUEUED":
        end_job(job, "CANCELLED", result={"model_version": None, "stop_reason": "cancelled", "steps": 0,
                                           "wall_seconds": 0.0})
    elif job.state == "RUNNING":
        job.state = "CANCELLING"
        log_state(job)
    return job


# --- the lease, used by the worker ---------------------------------------------------------------

def acquire_lease(session: Session, job_id: str, owner: str, lease_seconds: float) -> bool:
    """Atomically take a QUEUED job, or one whose worker's lease has expired; False: leave it alone."""
    now = utcnow()
    taken = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.attempt < Job.max_attempts,
               or_(Job.state == "QUEUED",
                   and_(Job.state.in_(("RUNNING", "CANCELLING")), Job.lease_expires_at < now)))
        .values(state="RUNNING", attempt=Job.attempt + 1, lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now, updated_at=now)
        .execution_options(synchronize_session=False))
    if taken.rowcount:
        job = session.get(Job, job_id)
        session.refresh(job)
        if job.started_at is None:
            job.started_at = now
        if job.cancel_requested:  # cancelled while its worker was dead
            job.state = "CANCELLING"
        log_state(job, {"worker": owner})
    return bool(taken.rowcount)


def fail_exhausted(session: Session, job_id: str) -> bool:
    """A job whose workers died max_attempts times ends FAILED with the reason."""
    job = session.get(Job, job_id)
    if job is None or job.state in TERMINAL or job.attempt < job.max_attempts:
        return False
    if job.state in ("RUNNING", "CANCELLING") and job.lease_expires_at and job.lease_expires_at >= utcnow():
        return False
    end_job(job, "FAILED", error={"type": "https://lethe.dev/problems/worker-lost", "title": "Worker lost",
                                  "status": 500, "detail": f"the worker died during each of {job.attempt} attempts"})
    return True


def heartbeat(session: Session, job_id: str, owner: str, lease_seconds: float, progress: dict | None):
    """Extend the lease and store progress. Returns (still ours, cancel requested)."""
    now = utcnow()
    values = {"heartbeat_at": now, "lease_expires_at": now + timedelta(seconds=lease_seconds), "updated_at": now}
    if progress is not None:
        values["progress"] = progress
    done = session.execute(update(Job).where(Job.id == job_id, Job.lease_owner == owner,
                                             Job.state.in_(("RUNNING", "CANCELLING"))).values(**values)
                           .execution_options(synchronize_session=False))
    if not done.rowcount:
        return False, False
    return True, bool(session.scalar(select(Job.cancel_requested).where(Job.id == job_id)))


def jobs_to_resend(session: Session, queued_after: datetime, now: datetime) -> list[str]:
    """QUEUED jobs not sent for a while, and RUNNING jobs whose lease expired since they were last sent."""
    rows = session.scalars(select(Job).where(or_(
        and_(Job.state == "QUEUED", or_(Job.enqueued_at.is_(None), Job.enqueued_at < queued_after)),
        and_(Job.state.in_(("RUNNING", "CANCELLING")), Job.lease_expires_at < now,
             or_(Job.enqueued_at.is_(None), Job.enqueued_at < Job.lease_expires_at))))).all()
    for job in rows:
        job.enqueued_at = now
    return [job.id for job in rows]
