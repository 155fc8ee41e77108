"""Unlearning jobs in the database: creation, views, cancellation, and the lease that makes delivery
at-least-once without a double run (SPEC section 9)."""
from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import CursorResult, and_, func, or_, select, text, update
from sqlalchemy.orm import Session, object_session

from lethe.engine.connectivity.params import MARGIN_FIELDS
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.job_spec import JobSpec
from lethe.service.domain import audit_log
from lethe.service.domain.digests import canonical_sha256, current_key, rekey
from lethe.service.domain.errors import Problem, not_found
from lethe.service.infra.tables import TERMINAL, Job, Model, new_id, utcnow


def forget_evidence(records: list[dict]) -> dict:
    """What stays of the erased data: the count, each record's keyed hash (and its given secrets', one by one;
    lethe.service.domain.digests), and the set's manifest hash (the sha256 of that list)."""
    key = current_key()

    def keyed(value) -> str:
        return rekey(canonical_sha256(value), key)

    hashes = [{"id": r["id"], "hmac": keyed(r),
               **({"secrets_hmac": [keyed(x) for x in r["secrets"]]} if r.get("secrets") else {})}
              for r in records]
    return {"count": len(records), "records": hashes, "manifest_sha256": canonical_sha256(hashes)}


def record_content(record: dict) -> str:
    """What a record says, whitespace collapsed, its id and secrets aside: the same text under another id is the
    same record."""
    parts = [record["prompt"], record["completion"]] if "prompt" in record else [record.get("text", "")]
    return "\x00".join(" ".join(str(p).split()) for p in parts)


def without_forget(records: list[dict] | None, forget: list[dict]) -> tuple[list[dict] | None, int]:
    """`records` less every record that says what a forget record says, and how many went: a record being erased is
    never also trained to be kept (issue 26)."""
    if not records:
        return records, 0
    erased = {record_content(r) for r in forget}
    kept = [r for r in records if record_content(r) not in erased]
    return kept, len(records) - len(kept)


def prune_model_records(session: Session, model: Model, forget: list[dict], request_id: str) -> int:
    """After an erasure succeeded: the model's registered retain set loses the records it erased (audited, by
    count), so no later job trains them to be kept, and its utility set too, so that no audit counts answering them
    as utility. How many retain records went."""
    kept, removed = without_forget(model.retain_records, forget)
    if removed:
        model.retain_records = kept
        audit_log.append(session, model.tenant, "model.retain_pruned", model.id,
                         {"request_id": request_id, "removed": removed})
    useful, unused = without_forget(model.utility_records, forget)
    if unused:
        model.utility_records = useful or None
        audit_log.append(session, model.tenant, "model.utility_pruned", model.id,
                         {"request_id": request_id, "removed": unused})
    return removed


def accumulate_model_retain(session: Session, model: Model, records: list[dict], request_id: str, limit: int) -> int:
    """After an erasure succeeded: the retain records its request named join the model's retain set (each text once,
    an id already taken made unique, at most `limit` in all), so that later requests that name none keep them too
    (issue 28). Audited, by count; how many were added."""
    kept = list(model.retain_records or [])
    texts, ids = {record_content(r) for r in kept}, {str(r["id"]) for r in kept}
    added: list[dict] = []
    for record in records:
        content = record_content(record)
        if content in texts or len(kept) + len(added) >= limit:
            continue
        rid, n = str(record["id"]), 1
        while rid in ids:
            rid, n = f"{record['id']}~{n}", n + 1
        texts.add(content)
        ids.add(rid)
        added.append({**record, "id": rid})
    if added:
        model.retain_records = [*kept, *added]
        audit_log.append(session, model.tenant, "model.retain_added", model.id,
                         {"request_id": request_id, "added": len(added)})
    return len(added)


def new_job(tenant: str, model: Model, spec: JobSpec, *, request_id: str, base_version: int,
            forget: list[dict], retain: list[dict] | None, max_attempts: int, kind: str = "unlearning",
            follows_head: bool = False, requested: dict | None = None, holdout: list[dict] | None = None,
            audit_options: dict | None = None, mcu_options: dict | None = None, coalesce: bool = True) -> Job:
    """A QUEUED job: the checked specification it runs (`spec`, stored canonical), the request's own parameters
    (`requested`, kept as asked) and the records, of which only the evidence outlives the job."""
    return Job(id=new_id("job"), tenant=tenant, kind=kind, model_id=model.id, base_version=base_version,
               follows_head=follows_head, request_id=request_id, method=spec.method or "mcu", preset=spec.preset,
               params=requested or {}, spec=spec.stored(), state="QUEUED", forget_records=forget,
               forget_evidence=forget_evidence(forget), retain_records=retain, holdout_records=holdout, progress={},
               attempt=0, max_attempts=max_attempts, cancel_requested=False, audit_options=audit_options,
               mcu_options=mcu_options, coalesce=coalesce)


# Advisory lock classes of per-tenant counts that a check and an insert must see alike (the audit log's is 7310001).
QUOTA_LOCK = 7310002  # jobs not ended
ENDPOINTS_LOCK = 7310003  # webhook endpoints


def spec_from_request(job: Job) -> JobSpec | None:
    """The specification of a job queued before specifications were stored (migration 0005, frozen): what it
    stored (params as requested, preset, MCU options) parsed by today's rules; None where it no longer passes."""
    options = dict(job.mcu_options or {})
    flat = {**(options.get("params") or {}),
            **{k: options[k] for k in ("curve", "points", "ensemble", "tolerance") if k in options}}
    try:
        if job.kind == "connectivity":
            return JobSpec.curve(flat)
        flat = {k: v for k, v in flat.items() if k not in MARGIN_FIELDS}  # the curves take the job's own margin
        return JobSpec.unlearning(job.method, job.params, job.preset, flat if job.mcu_options else None)
    except EngineInputError:
        return None


def lock_tenant(session: Session, tenant: str, lock_class: int = QUOTA_LOCK) -> None:
    """Hold one of the tenant's counts until the transaction ends, so that two requests cannot both count before
    either inserts its own (PostgreSQL: an advisory lock per tenant and class; SQLite: the database's write lock)."""
    if session.get_bind().dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:4], "big", signed=True)
        session.execute(text("SELECT pg_advisory_xact_lock(:cls, :key)"), {"cls": lock_class, "key": key})
    else:  # a write that changes nothing still takes SQLite's write lock, held to the commit
        session.execute(update(Job).where(Job.id == "").values(id=Job.id).execution_options(synchronize_session=False))


def check_quota(session: Session, tenant: str, settings) -> None:
    """429 when the tenant already has max_active_jobs jobs not ended, or its jobs ran more worker seconds
    than max_worker_seconds_per_day over the last 24 hours. The tenant's quota stays locked to the end of the
    caller's transaction, which inserts the job: parallel submissions are counted one after another."""
    lock_tenant(session, tenant)
    active = session.scalar(select(func.count()).select_from(Job).where(Job.tenant == tenant,
                                                                       Job.state.not_in(TERMINAL)))
    if active >= settings.max_active_jobs:
        raise Problem(429, "quota-exceeded", "Quota exceeded",
                      f"this tenant has {active} jobs not ended, the most it may have (LETHE_MAX_ACTIVE_JOBS)",
                      headers={"Retry-After": "60"})
    if settings.max_worker_seconds_per_day > 0:
        since = utcnow() - timedelta(days=1)
        rows = session.execute(select(Job.started_at, Job.ended_at).where(
            Job.tenant == tenant, Job.started_at.is_not(None), or_(Job.ended_at.is_(None), Job.ended_at > since))).all()
        now = utcnow()
        used = sum(((end or now) - max(start, since)).total_seconds() for start, end in rows if start is not None)
        if used >= settings.max_worker_seconds_per_day:
            raise Problem(429, "quota-exceeded", "Quota exceeded",
                          f"this tenant's jobs used {used:.0f} worker seconds in the last 24 hours, the most it may "
                          "(LETHE_MAX_WORKER_SECONDS_PER_DAY)", headers={"Retry-After": "3600"})


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
        "run_id": job.run_id, "coalesce": job.coalesce,
    }


def session_of(job: Job) -> Session:
    session = object_session(job)
    if session is None:
        raise RuntimeError(f"job {job.id} is not attached to a session")
    return session


def rowcount(session: Session, statement) -> int:
    """Rows an UPDATE matched."""
    return cast(CursorResult, session.execute(statement)).rowcount


class StateChanged(Exception):
    """A job's state moved under us (a cancel, a sweeper, another worker): the transition did not happen."""


def transition(job: Job, expected: tuple[str, ...], conditions: tuple = (), **values) -> None:
    """Compare-and-set: write `values` only while the job is still in one of the `expected` states (its
    own pending changes are flushed first and go or stay with the transaction). Raises StateChanged
    otherwise, so that the caller's transaction rolls back instead of overwriting a newer state."""
    session = session_of(job)
    session.flush()
    done = rowcount(session, update(Job).where(Job.id == job.id, Job.state.in_(expected), *conditions)
                    .values(**values, updated_at=utcnow()).execution_options(synchronize_session=False))
    session.refresh(job)
    if not done:
        raise StateChanged(f"job {job.id} is {job.state}, not {' or '.join(expected)}")


def end_job(job: Job, state: str, *, error: dict | None = None, result: dict | None = None,
            expected: tuple[str, ...] | None = None, conditions: tuple = ()) -> None:
    """A terminal state, from `expected` (default: the state the job was read in): the records go (forget, retain
    and holdout: a later erasure must not find its text kept in an ended job), the forget set's evidence stays. The
    audit log gets the error's code, never its free text (which may quote a record)."""
    values = dict(state=state, ended_at=utcnow(), forget_records=None, retain_records=None, holdout_records=None,
                  lease_owner=None, lease_expires_at=None)
    if error is not None:
        values["error"] = error
    if result is not None:
        values["result"] = result
    transition(job, expected or (job.state,), conditions, **values)
    log_state(job, {"error": error_code(error)} if error else {"result": result})


def error_code(error: dict) -> dict:
    """A problem as the audit log and webhooks carry it: its type's last segment and its status."""
    return {"code": str(error.get("type") or "about:blank").rstrip("/").rsplit("/", 1)[-1],
            "status": error.get("status")}


def log_state(job: Job, data: dict | None = None) -> None:
    """Every job state change goes into the audit log, in the transaction that makes it."""
    audit_log.append(session_of(job), job.tenant, f"job.{job.state.lower()}", job.id,
                     {"request_id": job.request_id, "model_id": job.model_id, "attempt": job.attempt, **(data or {})})


def request_cancel(session: Session, job: Job) -> Job:
    """QUEUED ends CANCELLED here; RUNNING becomes CANCELLING (its worker stops at the next heartbeat).
    Each step is compare-and-set: a job that ends meanwhile answers 409, never turns back."""
    for _ in range(3):  # the state may move between the read and the write; read again
        if job.state in TERMINAL:
            raise Problem(409, "job-terminal", "Job already ended", f"job {job.id} is {job.state}")
        try:
            if job.state == "QUEUED":
                end_job(job, "CANCELLED", expected=("QUEUED",), result={
                    "model_version": None, "stop_reason": "cancelled", "steps": 0, "wall_seconds": 0.0})
            else:
                was = job.state
                transition(job, (was,), state="CANCELLING", cancel_requested=True)
                if was != "CANCELLING":
                    log_state(job)
            return job
        except StateChanged:
            continue
    raise Problem(409, "conflict", "Conflict", f"job {job.id} changed state while being cancelled; try again")


# --- the lease, used by the worker ---------------------------------------------------------------

def acquire_lease(session: Session, job_id: str, owner: str, lease_seconds: float) -> bool:
    """Atomically take a QUEUED job, or one whose worker's lease has expired; False: leave it alone."""
    now = utcnow()
    taken = rowcount(session,
        update(Job)
        .where(Job.id == job_id, Job.attempt < Job.max_attempts,
               or_(Job.state == "QUEUED",
                   and_(Job.state.in_(("RUNNING", "CANCELLING")), Job.lease_expires_at < now)))
        .values(state="RUNNING", attempt=Job.attempt + 1, lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now, updated_at=now)
        .execution_options(synchronize_session=False))
    if taken:
        job = session.get_one(Job, job_id)
        session.refresh(job)
        if job.started_at is None:
            job.started_at = now
        if job.cancel_requested:  # cancelled while its worker was dead
            job.state = "CANCELLING"
        log_state(job, {"worker": owner})
    return bool(taken)


def owned_job(session: Session, job_id: str, owner: str) -> Job | None:
    """The job, locked for this transaction, while its lease is still `owner`'s; None once a cancel, the sweeper or
    another worker has taken it: a worker then writes nothing."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None or job.lease_owner != owner or job.state not in ("RUNNING", "CANCELLING"):
        return None
    return job


def still_ours(owner: str) -> dict:
    """end_job's compare-and-set terms for a worker ending its own job."""
    return dict(expected=("RUNNING", "CANCELLING"), conditions=(Job.lease_owner == owner,))


def fail_exhausted(session: Session, job_id: str) -> bool:
    """A job whose workers died max_attempts times ends FAILED with the reason (compare-and-set: a job that
    a worker finishes meanwhile stays SUCCEEDED)."""
    job = session.get(Job, job_id)
    if job is None or job.state in TERMINAL or job.attempt < job.max_attempts:
        return False
    if job.state in ("RUNNING", "CANCELLING") and job.lease_expires_at and job.lease_expires_at >= utcnow():
        return False
    try:
        end_job(job, "FAILED", expected=("QUEUED", "RUNNING", "CANCELLING"),
                conditions=(or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < utcnow()),),
                error={"type": "https://lethe.dev/problems/worker-lost", "title": "Worker lost", "status": 500,
                       "detail": f"the worker died during each of {job.attempt} attempts"})
    except StateChanged:  # finished, or its lease renewed, since it was read
        return False
    return True


def heartbeat(session: Session, job_id: str, owner: str, lease_seconds: float, progress: dict | None):
    """Extend the lease and store progress. Returns (still ours, cancel requested)."""
    now = utcnow()
    values: dict[str, object] = {"heartbeat_at": now, "lease_expires_at": now + timedelta(seconds=lease_seconds),
                                 "updated_at": now}
    if progress is not None:
        values["progress"] = progress
    done = rowcount(session, update(Job).where(Job.id == job_id, Job.lease_owner == owner,
                                               Job.state.in_(("RUNNING", "CANCELLING"))).values(**values)
                    .execution_options(synchronize_session=False))
    if not done:
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
