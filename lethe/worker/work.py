"""What a job's run needs, read from the database in one transaction before the run starts (the worker holds
no session while it trains), and the lease keeper that renews the job's lease while it runs."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.engine.data.inputs import RunInputs
from lethe.engine.job_spec import JobSpec
from lethe.service.domain.errors import Problem, invalid
from lethe.service.domain.jobs import StateChanged, end_job, heartbeat, log_state, owned_job, spec_from_request
from lethe.service.domain.lineage import (
    PURGED,
    RETIRED,
    SERVED,
    find_version,
    get_model,
    get_version,
    lock_model,
    missing_erasures,
)
from lethe.service.domain.runs import Member, union_records, union_retain
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import TERMINAL, Job, Model, ModelVersion, RetrainReference, utcnow
from lethe.service.settings import get_settings

log = logging.getLogger("lethe.worker")


class LeaseKeeper(threading.Thread):
    """Renews the lease and publishes progress every heartbeat; notices cancellation and a lost lease."""

    def __init__(self, job_id: str, owner: str, deadline: datetime | None = None, members: list[str] | None = None):
        super().__init__(name=f"lease-{job_id}", daemon=True)
        self.job_id, self.owner, self.deadline = job_id, owner, deadline
        self.members = [m for m in members or [] if m != job_id]  # the other jobs of a coalesced run (issue 28)
        self.settings = get_settings()
        self.latest_progress: dict | None = None
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self.timed_out = threading.Event()  # past the job's wall-clock limit (LETHE_MAX_JOB_SECONDS)
        self.done = threading.Event()

    def beat(self) -> None:
        """Every job of the run: a member cancelled stops the run (the others go back to the queue), a member whose
        lease is gone stops it too (lethe.service.domain.runs)."""
        for job_id in (self.job_id, *self.members):
            with session_scope() as session:
                ours, cancel = heartbeat(session, job_id, self.owner, self.settings.lease_seconds,
                                         self.latest_progress)
            if not ours:
                self.lost.set()
            if cancel:
                self.cancelled.set()
        if self.deadline is not None and utcnow() >= self.deadline:
            self.timed_out.set()

    def run(self) -> None:
        while not self.done.wait(self.settings.heartbeat_seconds):
            try:
                self.beat()
            except Exception:  # a database hiccup: the lease has slack for a few missed beats
                log.exception("heartbeat failed for job %s", self.job_id)

    def should_stop(self) -> bool:
        return self.cancelled.is_set() or self.lost.is_set() or self.timed_out.is_set()


def deadline(job: Job, max_seconds: float) -> datetime | None:
    """When the job's wall-clock limit runs out: from its first start, whatever attempt this is."""
    if max_seconds <= 0 or job.started_at is None:
        return None
    return job.started_at + timedelta(seconds=max_seconds)


def time_limit_problem(max_seconds: float) -> dict:
    return Problem(504, "time-limit", "Time limit exceeded",
                   f"the job ran longer than this service allows a job ({max_seconds:.0f} s from its first start, "
                   "LETHE_MAX_JOB_SECONDS); no version was made. Fewer records, a smaller max_steps, or a device "
                   "with more throughput").body()


@dataclass
class Work:
    """What a job's run needs, read in one transaction: the worker holds no database session while it trains."""
    job_id: str
    kind: str  # "unlearning" or "connectivity"
    attempt: int
    spec: JobSpec  # checked at submission: trusted
    forget: list[dict]
    retain: list[dict]
    holdout: list[dict] = field(default_factory=list)
    audit_options: dict = field(default_factory=dict)
    base: str | None = None  # the base version's store location (unlearning)
    parent: int | None = None  # its number: the new version's parent
    reference: str | None = None  # the retrain reference's location, if one is registered for this forget set
    card: dict = field(default_factory=dict)  # the model card's lineage
    curves_from: dict[int, str] = field(default_factory=dict)  # each curve's start version -> its location
    curve_to: tuple[int, str] | None = None  # a connectivity job's end version and its location
    members: list[Member] = field(default_factory=list)  # a coalesced run's requests, the leader first; [] alone
    anchor: tuple[int, str] | None = None  # the retain term's fixed version and its location; None: the base itself
    utility: list[dict] = field(default_factory=list)  # the model's utility set: measured by the audit, never trained

    @cached_property
    def inputs(self) -> RunInputs:
        """The records as the run, the audit and the curves read them: normalised once, for all three."""
        return RunInputs.of(self.forget, self.retain, self.holdout, self.spec.format,
                            forget_required=self.kind != "connectivity")

    def coalesce(self, jobs: list[Job]) -> None:
        """The run of several requests (lethe.service.domain.runs): their records unioned under prefixed ids, every
        request in the model card."""
        self.forget = union_records(jobs, "forget_records")
        self.retain = union_retain(jobs, self.forget)
        self.holdout = union_records(jobs, "holdout_records")
        self.card["erased"] = [*self.card["erased"][:-1], *(j.request_id for j in jobs)]
        self.members = [Member(j.id, j.request_id, j.forget_evidence["count"]) for j in jobs]

    def folder(self, name: str) -> str:
        """This attempt's own folder in the store: a worker that lost its lease but still runs cannot overwrite
        the files of its successor, whose version points at its own folder."""
        return f"jobs/{self.job_id}/attempt-{self.attempt}/{name}"


def while_ours(job_id: str, keeper: LeaseKeeper, finish: Callable[[Session, Job], str]) -> str:
    """Stop the lease keeper and run `finish` in one transaction on the job, locked, if its lease is still this
    worker's; "lease lost" when a cancel, the sweeper or another worker took it (before or during the write)."""
    keeper.done.set()
    try:
        with session_scope() as session:
            job = owned_job(session, job_id, keeper.owner)
            return "lease lost" if job is None else finish(session, job)
    except StateChanged:
        return "lease lost"


def predates(number: int, missing: list[str], detail: str) -> dict:
    """The problem of a base version that no longer holds every erasure."""
    return Problem(409, "version-predates-erasures", "Version predates erasures",
                   f"version {number} {detail} (request(s) {', '.join(missing[:10])})").body()


def read_work(session: Session, job: Job) -> Work | None:
    """The job's run, read from the database; None when its base version no longer holds every erasure (the job
    is then FAILED)."""
    # A job queued before specifications were stored (migration 0005) has its request parsed by today's rules.
    spec = JobSpec.from_stored(job.spec) if job.spec is not None else spec_from_request(job)
    if spec is None:
        end_job(job, "FAILED", error=invalid("the job's stored request no longer passes the engine's checks; "
                                             "submit it again").body())
        return None
    model = get_model(session, job.tenant, job.model_id)
    work = Work(job.id, job.kind, job.attempt, spec, job.forget_records or [], job.retain_records or [])
    if job.kind == "connectivity":
        options = job.mcu_options or {}
        ends = version_dirs(session, model, [options["a"], options["b"]])
        work.curves_from, work.curve_to = {options["a"]: ends[options["a"]]}, (options["b"], ends[options["b"]])
        return work
    base = start_version(session, model, job)
    if base is None:
        return None
    reference = session.scalar(select(RetrainReference).where(
        RetrainReference.model_id == model.id,
        RetrainReference.forget_manifest_sha256 == job.forget_evidence["manifest_sha256"]))
    work.holdout, work.audit_options = job.holdout_records or [], job.audit_options or {}
    work.base, work.parent = base.location, base.number
    work.reference = _reference_location(session, model, reference)
    work.anchor = _anchor(session, model, base)
    work.utility = model.utility_records or []
    work.card = dict(model=model.name, source=model.source, parent=base.number, job=job.id,
                     erased=[*base.erased_request_ids, job.request_id])
    if job.mcu_options:
        work.curves_from = version_dirs(session, model, job.mcu_options["against"])
    return work


READABLE = (SERVED, RETIRED)  # a worker reads a retired version's files (still stored); a purged one has none


def model_busy(session: Session, job_id: str) -> str | None:
    """Another unlearning job of the same model that has started and not ended: this one waits for it, so
    that each new version starts from the one before and holds every erasure (issue 12). A lease that
    expired does not free the model (its worker may only be slow; the sweeper re-sends or fails that job).
    The model's row is locked first, so two workers cannot both find the model free (released when the
    caller's transaction ends)."""
    job = session.get(Job, job_id)
    if job is None or job.kind == "connectivity" or job.state in TERMINAL:
        return None
    lock_model(session, job.model_id)
    # A member of the same coalesced run is not another job: after its worker died, whichever member arrives first
    # takes the run over (lethe.service.domain.runs).
    same_run = [Job.run_id.is_(None) | (Job.run_id != job.run_id)] if job.run_id else []
    return session.scalar(select(Job.id).where(
        Job.model_id == job.model_id, Job.id != job_id, Job.kind != "connectivity",
        Job.state.in_(("RUNNING", "CANCELLING")), *same_run).limit(1))


def start_version(session: Session, model: Model, job: Job) -> ModelVersion | None:
    """The version the job starts from: the head now, where the request named none; else the named one,
    which must still hold every erasure done on the model (else the job FAILS, saying which)."""
    if job.follows_head:
        base = get_version(session, model, None)
        if base.number != job.base_version:
            job.base_version = base.number
            log_state(job, {"base_version": base.number, "reason": "the head moved since submission"})
        return base
    base = get_version(session, model, job.base_version, READABLE)
    if missing := missing_erasures(session, base):
        end_job(job, "FAILED", error=predates(base.number, missing, "still holds data erased since this job was "
                                              "submitted; submit again without a version to start from the head"))
        return None
    return base


def version_dirs(session: Session, model: Model, numbers: list[int]) -> dict[int, str]:
    """Store locations of the named versions."""
    return {n: get_version(session, model, n, READABLE).location for n in numbers}


def _anchor(session: Session, model: Model, base: ModelVersion) -> tuple[int, str] | None:
    """The version the retain term anchors to (the model's pinned one, else the root) and its files; None where it is
    the base itself (pi_0 is then the anchor) or its files were purged (the run then anchors to its base, as
    before issue 28, and its result names no anchor)."""
    number = model.anchor_version or 1
    if number == base.number:
        return None
    version = find_version(session, model, number)
    return None if version.state == PURGED else (number, version.location)


def _reference_location(session: Session, model: Model, reference: RetrainReference | None) -> str | None:
    """The retrain reference's files; None where there is none or its files were purged (the audit then has no
    reference, as for a model without one)."""
    if reference is None:
        return None
    version = find_version(session, model, reference.version_number)
    return None if version.state == PURGED else version.location


