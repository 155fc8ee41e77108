"""Coalesced runs (issue 28): when a job of a model starts, the model's other queued requests that can run the same
way join it, so that one MASC run and one audit serve all of them and one new version holds every erasure.

A request joins when it belongs to the same model (so the same tenant), is an unlearning job still QUEUED, allows it
(`coalesce`, default true), runs the same stored specification with the same audit options on the same queue,
starts from the version the run starts from (it follows the head, or names that version), asks for no connectivity
curves, and has no retrain reference registered for its forget set (its audit compares against it alone). Members
of a run whose worker died (leases expired) join the run that takes them over. The run is capped by
`coalesce_max_requests` and `coalesce_max_records` (forget records). Each member keeps its own job: lease, events,
result, report and verdict; its records enter the run under ids prefixed by its job id, so that two requests may
use the same record ids and each request's slice of the result and the audit can be read back."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from lethe.engine.contract.record_checks import REQUEST
from lethe.service.domain.jobs import acquire_lease, log_state, record_content, transition
from lethe.service.infra.tables import Job, RetrainReference, utcnow

SEPARATOR = "/"  # between a member's job id and its record's own id, in the run


def member_prefix(job_id: str) -> str:
    return f"{job_id}{SEPARATOR}"


@dataclass(frozen=True)
class Member:
    """One request in a coalesced run: its job, and the prefix of its records' ids in the run."""
    job_id: str
    request_id: str
    forget_count: int

    @property
    def prefix(self) -> str:
        return member_prefix(self.job_id)


def can_lead(session: Session, job: Job) -> bool:
    """Whether a starting job gathers others: it allows coalescing, asks for no curves, has no retrain reference."""
    return job.kind == "unlearning" and job.coalesce and not job.mcu_options and not _has_reference(session, job)


def _has_reference(session: Session, job: Job) -> bool:
    return session.scalar(select(RetrainReference.id).where(
        RetrainReference.model_id == job.model_id,
        RetrainReference.forget_manifest_sha256 == job.forget_evidence["manifest_sha256"]).limit(1)) is not None


def joinable(session: Session, leader: Job, start_version: int, max_requests: int, max_records: int) -> list[Job]:
    """The queued requests that join `leader`'s run, oldest first, within the caps (the leader counts in both). The
    caller holds the model's lock (lethe.worker.work.model_busy), so no other worker gathers the same jobs."""
    now = utcnow()
    mine = [Job.state == "QUEUED"]
    if leader.run_id:  # the members of this job's earlier run whose worker died
        mine.append(and_(Job.run_id == leader.run_id, Job.state.in_(("RUNNING", "CANCELLING")),
                         Job.lease_expires_at < now))
    candidates = session.scalars(select(Job).where(
        Job.model_id == leader.model_id, Job.id != leader.id, Job.kind == "unlearning", Job.coalesce.is_(True),
        Job.cancel_requested.is_(False), Job.attempt < Job.max_attempts, or_(*mine))
        .order_by(Job.created_at, Job.id)).all()
    joined: list[Job] = []
    records = leader.forget_evidence["count"]
    for job in candidates:
        if len(joined) + 1 >= max_requests:
            break
        if (job.spec != leader.spec or (job.audit_options or {}) != (leader.audit_options or {})
                or job.queue != leader.queue or job.mcu_options
                or not (job.follows_head or job.base_version == start_version) or _has_reference(session, job)):
            continue
        if records + job.forget_evidence["count"] > max_records:
            continue
        records += job.forget_evidence["count"]
        joined.append(job)
    return joined


def join(session: Session, leader: Job, jobs: list[Job], owner: str, lease_seconds: float,
         start_version: int) -> list[Job]:
    """Take each job's lease for this worker (RUNNING, attempt + 1) and mark it, and the leader, as one run; the
    jobs whose lease another worker took meanwhile stay out. Returns the members that joined, the leader first."""
    members = [leader]
    for job in jobs:
        if not acquire_lease(session, job.id, owner, lease_seconds):
            continue
        session.refresh(job)
        if job.follows_head and job.base_version != start_version:
            job.base_version = start_version
        members.append(job)
    if len(members) > 1:
        for job in members:
            job.run_id = leader.id
            log_state(job, {"run_id": leader.id, "joined": [j.id for j in members],
                            "base_version": start_version})
    elif leader.run_id is not None:
        leader.run_id = None  # the earlier run's other members ended meanwhile: this one runs alone
    return members


def union_records(members: list[Job], field: str) -> list[dict]:
    """The members' records of one set (forget_records, holdout_records) with ids prefixed by their job's, each
    naming its job as its request (record_checks.REQUEST): the stop rule holds a record's answers to its own
    request's content, as that request's own run would."""
    return [{**record, "id": member_prefix(job.id) + str(record["id"]), REQUEST: job.id}
            for job in members for record in (getattr(job, field) or [])]


def union_retain(members: list[Job], forget: list[dict]) -> list[dict]:
    """The members' retain records, each text once and none that a member erases, ids prefixed (first seen wins)."""
    erased = {record_content(r) for r in forget}
    seen: set[str] = set()
    out = []
    for job in members:
        for record in job.retain_records or []:
            content = record_content(record)
            if content in erased or content in seen:
                continue
            seen.add(content)
            out.append({**record, "id": member_prefix(job.id) + str(record["id"])})
    return out


def requeue(job: Job, why: str) -> None:
    """A member of a run that stopped without a version because another member was cancelled (or its lease was
    lost): back to QUEUED, to run again without it; the attempt it spent does not count against it."""
    transition(job, ("RUNNING", "CANCELLING"), state="QUEUED", lease_owner=None, lease_expires_at=None,
               run_id=None, attempt=max(job.attempt - 1, 0), enqueued_at=None)
    log_state(job, {"reason": why})
