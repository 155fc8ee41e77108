"""/v1/unlearning-jobs: submit a deletion request, follow it (poll or server-sent events), cancel it."""
from __future__ import annotations

import asyncio
import json
import logging

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.engine.contract.chat_format import refuse_text
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.job_spec import JobSpec
from lethe.service.api.auth import Principal, require
from lethe.service.api.idempotency import idempotent
from lethe.service.api.pagination import paginate
from lethe.service.api.schemas import CurveOptions, JobCreate, JobOut, Page
from lethe.service.domain import capacity, connectivity, lineage
from lethe.service.domain.checkpoints import check_chat_template, check_targets
from lethe.service.domain.errors import Problem, invalid, not_found
from lethe.service.domain.jobs import check_quota, get_job, job_view, log_state, new_job, request_cancel, without_forget
from lethe.service.domain.subjects import record_subjects
from lethe.service.infra.artifacts import artifact_store
from lethe.service.infra.db import INJECTED, session_scope, transactional
from lethe.service.infra.queue import enqueue
from lethe.service.infra.tables import JOB_STATES, TERMINAL, ApiKey, Job, Model, utcnow
from lethe.service.reports.html import render_report
from lethe.service.settings import get_settings

router = APIRouter(prefix="/v1/unlearning-jobs", tags=["unlearning jobs"])
log = logging.getLogger("lethe.api")


def checked_records(records: list, what: str, limit: int) -> list[dict]:
    """A record set checked with the engine's own rules, within the service's size limit."""
    if len(records) > limit:
        raise invalid(f"{what}: {len(records)} records exceed the limit of {limit}", what)
    return normalise_records(records, what, allow_empty=what != "forget")


def job_spec(body: JobCreate, model: Model) -> JobSpec:
    """The request's method, parameters and curves, checked once with the engine's own rules (so that a job never
    fails later on them), every default and preset resolved: what the worker runs. The format is the request's,
    else the model's."""
    try:
        return JobSpec.unlearning(body.method, body.params, body.preset,
                                  body.mcu.engine_values() if body.mcu is not None else None,
                                  body.format or model.format)
    except EngineInputError as exc:
        if exc.field and exc.field.startswith("mcu."):
            raise EngineInputError(str(exc), field="mcu." + CurveOptions.body_field(exc.field[4:])) from None
        raise


def send(payload: dict) -> None:
    """Enqueue after commit; if the broker is down the job stays QUEUED and the sweeper re-sends it."""
    with session_scope() as session:
        job = session.get(Job, payload["id"])
        queue = job.queue if job is not None else None
    try:
        enqueue(payload["id"], queue=queue)
    except Exception:
        log.exception("could not enqueue job %s; the sweeper will retry", payload["id"])
        return
    with session_scope() as session:
        job = session.get(Job, payload["id"])
        if job is not None and job.enqueued_at is None:
            job.enqueued_at = utcnow()


@router.post("", status_code=202, response_model=JobOut)
@transactional
def submit(body: JobCreate, request: Request, who: Principal = Depends(require("jobs:write")),
           session: Session = INJECTED, idempotency_key: str | None = Header(None)):
    """Submit a deletion request: 202 with the job and its Location. Records and parameters are checked here, once;
    the job runs the specification stored with it. An Idempotency-Key replays the first answer."""
    def create():
        settings = get_settings()
        check_quota(session, who.tenant, settings)
        model = lineage.get_model(session, who.tenant, body.model_id)
        version = lineage.get_version(session, model, body.version)
        if missing := lineage.missing_erasures(session, version):
            raise Problem(409, "version-predates-erasures", "Version predates erasures",
                          f"version {version.number} still holds data erased by request(s) {', '.join(missing[:10])}; "
                          "a new version must start from one that holds every erasure (leave version out: the head)")
        forget = checked_records(body.forget, "forget", settings.max_records)
        retain = checked_records(body.retain, "retain", settings.max_records) if body.retain is not None else None
        holdout = checked_records(body.holdout, "holdout", settings.max_records) if body.holdout is not None else None
        spec = job_spec(body, model)
        assert spec.params is not None
        check_targets(spec.params.lora_targets, version.location)
        check_chat_template(spec.format, version.location)
        queue = capacity.route(session, spec, version, artifact_store(settings), settings)
        if spec.format == "chat":
            for what, records in (("forget", forget), ("retain", retain), ("holdout", holdout)):
                refuse_text(records or [], what)
        mcu = None
        if body.mcu is not None:
            mcu = {**body.mcu.model_dump(), "against": connectivity.resolve_against(session, model, version.number,
                                                                                    body.mcu.against)}
        # A record being erased is never also trained to be kept, nor held out as unseen data.
        retain, retain_removed = without_forget(retain if retain is not None else model.retain_records, forget)
        holdout, holdout_removed = without_forget(holdout, forget)
        job = new_job(who.tenant, model, spec, request_id=body.request_id, base_version=version.number,
                      follows_head=body.version is None, requested=body.params, forget=forget,
                      retain=retain, holdout=holdout,
                      audit_options=body.audit.model_dump() if body.audit else None, mcu_options=mcu,
                      max_attempts=settings.max_attempts, coalesce=body.coalesce)
        job.queue = queue
        session.add(job)
        session.flush()
        subjects = record_subjects(session, job, body.subjects or [])
        removed = {k: n for k, n in (("retain_removed", retain_removed), ("holdout_removed", holdout_removed)) if n}
        log_state(job, {"base_version": job.base_version, "forget": job.forget_evidence["manifest_sha256"],
                        "count": job.forget_evidence["count"], **removed,
                        **({"subjects": subjects} if subjects else {})})
        return 202, job_view(job), f"/v1/unlearning-jobs/{job.id}"

    return idempotent(session, who, request, idempotency_key, body.model_dump(mode="json"), create, after_commit=send)


@router.get("", response_model=Page)
@transactional
def list_jobs(who: Principal = Depends(require("jobs:read")), session: Session = INJECTED,
              state: str | None = None, model_id: str | None = None,
              page_size: int = Query(50, ge=1, le=500), page_token: str | None = None):
    """The tenant's jobs, newest first, optionally by state or model; paginated."""
    query = select(Job).where(Job.tenant == who.tenant)
    if state is not None:
        if state not in JOB_STATES:
            raise invalid(f"state must be one of {', '.join(JOB_STATES)}", "state")
        query = query.where(Job.state == state)
    if model_id is not None:
        query = query.where(Job.model_id == model_id)
    rows, token = paginate(session, query, Job, page_size, page_token)
    return {"items": [job_view(j) for j in rows], "next_page_token": token}


@router.get("/{job_id}", response_model=JobOut)
@transactional
def read_job(job_id: str, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """One job: state, progress (step, V, losses, heartbeat), timestamps, attempt, error or result."""
    return job_view(get_job(session, who.tenant, job_id))


@router.post("/{job_id}:cancel", response_model=JobOut)
@transactional
def cancel(job_id: str, who: Principal = Depends(require("jobs:write")), session: Session = INJECTED):
    """Cancel a job: QUEUED ends CANCELLED at once; RUNNING becomes CANCELLING until its worker stops (409 once
    ended)."""
    job = request_cancel(session, get_job(session, who.tenant, job_id))
    session.commit()
    return job_view(job)


@router.get("/{job_id}/result")
@transactional
def engine_result(job_id: str, who: Principal = Depends(require("jobs:read")),
                  session: Session = INJECTED):
    """The engine's full result of a job: stop-rule trace, per-record state, losses, parameters as run."""
    job = get_job(session, who.tenant, job_id)
    if job.engine_result is None:
        raise not_found(f"the result of job {job_id!r} (state {job.state})")
    return job.engine_result


@router.get("/{job_id}/report")
@transactional
def report(job_id: str, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """The audit report (JSON): the verdict and the evidence behind it."""
    job = get_job(session, who.tenant, job_id)
    if job.report is None:
        raise not_found(f"the report of job {job_id!r} (state {job.state}; reports exist for SUCCEEDED jobs)")
    return job.report


@router.get("/{job_id}/report.html", response_class=HTMLResponse)
@transactional
def report_html(job_id: str, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """The audit report as one self-contained page for people, the verdict first."""
    job = get_job(session, who.tenant, job_id)
    if job.report is None:
        raise not_found(f"the report of job {job_id!r} (state {job.state}; reports exist for SUCCEEDED jobs)")
    return HTMLResponse(render_report(job.report))


MAX_STREAMS_PER_KEY = 16  # open event streams one API key may hold on one API process
_streams: dict[str, int] = {}


@router.get("/{job_id}/events")
async def events(job_id: str, request: Request, who: Principal = Depends(require("jobs:read"))):
    """Server-sent events: `state` on each state change, `progress` on each new progress, until terminal. The key is
    checked again on every poll (a revoked key's stream ends with an `error` event), and one key holds at most
    MAX_STREAMS_PER_KEY streams (429 past it)."""
    def snapshot():
        with session_scope() as session:
            key = session.get(ApiKey, who.key_id)
            if key is None or key.revoked_at is not None:
                return None
            return jsonable_encoder(job_view(get_job(session, who.tenant, job_id)))

    if _streams.get(who.key_id, 0) >= MAX_STREAMS_PER_KEY:
        raise Problem(429, "too-many-streams", "Too many event streams",
                      f"this key holds {MAX_STREAMS_PER_KEY} open event streams, the most it may",
                      headers={"Retry-After": "5"})
    first = await asyncio.to_thread(snapshot)  # a 404 before the stream starts
    if first is None:
        raise Problem(401, "unauthenticated", "Unauthenticated", "unknown or revoked API key")
    _streams[who.key_id] = _streams.get(who.key_id, 0) + 1

    async def stream():
        view, last_state, last_progress, idle = first, None, None, 0.0
        try:
            while True:
                if view is None:  # the key was revoked while the stream was open
                    yield f"event: error\ndata: {json.dumps({'detail': 'the API key was revoked'})}\n\n"
                    return
                # Progress before state, so that a terminal state is the stream's last event.
                if view["progress"] != last_progress:
                    yield f"event: progress\ndata: {json.dumps(view['progress'])}\n\n"
                    last_progress, idle = view["progress"], 0.0
                if view["state"] != last_state:
                    yield f"event: state\ndata: {json.dumps(view)}\n\n"
                    last_state = view["state"]
                if view["state"] in TERMINAL or await request.is_disconnected():
                    return
                await asyncio.sleep(0.5)
                idle += 0.5
                if idle >= 15:
                    yield ": keep-alive\n\n"
                    idle = 0.0
                view = await asyncio.to_thread(snapshot)
        finally:
            _streams[who.key_id] -= 1
            if not _streams[who.key_id]:
                del _streams[who.key_id]

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
