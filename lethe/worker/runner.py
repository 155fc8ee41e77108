"""One job on a worker: take the lease, read the job's work, run the engine with heartbeats and cancellation,
store the checkpoint, create the version, end the job. Reads top to bottom."""
from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.training.result import UnlearnResult
from lethe.service.domain import audit_log, connectivity
from lethe.service.domain.errors import Problem
from lethe.service.domain.jobs import (
    accumulate_model_retain,
    acquire_lease,
    end_job,
    fail_exhausted,
    owned_job,
    prune_model_records,
    still_ours,
    without_forget,
)
from lethe.service.domain.lineage import add_version, get_model, get_version, lock_model, missing_erasures
from lethe.service.domain.retention import examples_until
from lethe.service.domain.retirement import retire_predecessors
from lethe.service.domain.runs import can_lead, join, joinable, requeue
from lethe.service.infra.artifacts import ArtifactStore, artifact_store
from lethe.service.infra.db import session_scope
from lethe.service.infra.queue import enqueue
from lethe.service.infra.tables import Job, ModelVersion, utcnow
from lethe.service.reports.coalesced import member_slice, run_summary
from lethe.service.reports.evidence import build_report
from lethe.service.settings import Settings, get_settings
from lethe.worker.connectivity import execute_connectivity, measure_curves, record_curves
from lethe.worker.work import (
    READABLE,
    LeaseKeeper,
    Work,
    deadline,
    model_busy,
    predates,
    read_work,
    time_limit_problem,
    while_ours,
)

log = logging.getLogger("lethe.worker")


def run(job_id: str) -> str:
    """Run one job (the Celery task's body); returns what happened, for the worker's log."""
    settings = get_settings()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    with session_scope() as session:
        if fail_exhausted(session, job_id):  # every attempt's worker died: FAILED, whatever else runs
            return "failed: attempts exhausted"
        if busy := model_busy(session, job_id):
            # one new version per model at a time
            enqueue(job_id, countdown=settings.heartbeat_seconds * 2, queue=session.get_one(Job, job_id).queue)
            session.get_one(Job, job_id).enqueued_at = utcnow()  # this chain re-sends it: the sweeper need not
            return f"waiting for job {busy}"
        if not acquire_lease(session, job_id, owner, settings.lease_seconds):
            return "skipped"  # finished, or running elsewhere: a duplicate delivery does nothing
        job = session.get_one(Job, job_id)
        if job.state == "CANCELLING":
            end_job(job, "CANCELLED", result=_summary(None, "cancelled", 0, 0.0))
            return "cancelled"
        ends = deadline(job, settings.max_job_seconds)
        if ends is not None and utcnow() >= ends:  # a delivery after its worker was killed at the time limit
            end_job(job, "FAILED", error=time_limit_problem(settings.max_job_seconds))
            return "failed: time limit"
        work = read_work(session, job)
        if work is None:
            return "failed: base version predates erasures"
        if work.kind == "unlearning" and can_lead(session, job):
            assert work.parent is not None
            joined = joinable(session, job, work.parent, settings.coalesce_max_requests,
                              settings.coalesce_max_records)
            if joined or job.run_id:
                members = join(session, job, joined, owner, settings.lease_seconds, work.parent)
                if len(members) > 1:
                    work.coalesce(members)

    keeper = LeaseKeeper(job_id, owner, ends, [m.job_id for m in work.members])
    keeper.start()
    try:
        return _execute(work, keeper, settings)
    finally:
        keeper.done.set()


def _execute(work: Work, keeper: LeaseKeeper, settings: Settings) -> str:
    from lethe.engine.model.loading import save_model
    from lethe.engine.model.memory_check import DoesNotFit

    store = artifact_store(settings)
    try:
        with tempfile.TemporaryDirectory(prefix="lethe-") as tmp:
            if work.kind == "connectivity":
                return execute_connectivity(work, keeper, settings, store, Path(tmp))
            assert work.base is not None and work.spec.params is not None
            source = store.local_path(work.base) or store.fetch_directory(work.base, Path(tmp) / "base")

            def progress(p):
                keeper.latest_progress = {k: p.get(k) for k in ("step", "max_steps", "violation_rate", "alpha",
                                                                 "losses")}

            result, model, tokenizer = _unlearn(work, str(source), settings, progress, keeper, Path(tmp), store)
            if keeper.lost.is_set():
                return "lease lost"  # another worker owns the job now; write nothing
            if keeper.timed_out.is_set():
                return _fail(work.job_id, keeper, time_limit_problem(settings.max_job_seconds))
            location = work.folder("model")
            manifest, audit, curves = None, None, []
            if model is not None:
                save_model(model, tokenizer, Path(tmp) / "out")
                (Path(tmp) / "out" / "README.md").write_text(model_card(work.card, result))
                manifest = store.put_local_directory(Path(tmp) / "out", location)
                # The audit reads the checkpoint as it is served: loaded back from the files just stored, not the
                # weights in memory (issue 25; the rule's own check ran on the merged copy in this dtype).
                dtype, placement = next(model.parameters()).dtype, getattr(model, "hf_device_map", None)
                del model  # before the load: not two copies at once
                audit = _audit_served(work, Path(tmp) / "out", dtype, placement, str(source), store, Path(tmp),
                                      settings.device)
                if work.curves_from:  # the curves load both ends themselves
                    curves = measure_curves(work, str(Path(tmp) / "out"), store, Path(tmp), keeper, settings.device,
                                            lambda m, t: _audit(work, m, t, str(source), store, Path(tmp)))
            if keeper.timed_out.is_set():  # the audit or the curves ran past the limit: the version is not made
                store.delete(work.folder(""))
                return _fail(work.job_id, keeper, time_limit_problem(settings.max_job_seconds))
            finished = _finish(work, keeper, result, location, manifest, audit, curves)
            if finished == "lease lost" and manifest is not None:
                store.delete(work.folder(""))  # nothing points at it
            return finished
    except DoesNotFit as exc:  # before the model was loaded: nothing ran out of memory
        return _fail(work.job_id, keeper, Problem(422, "does-not-fit", "Job does not fit", str(exc),
                                                  estimate=exc.plan.as_dict()).body())
    except EngineInputError as exc:
        return _fail(work.job_id, keeper, Problem(422, "invalid-request", "Invalid request", str(exc)).body())
    except Exception as exc:
        log.exception("job %s failed", work.job_id)
        detail = f"{type(exc).__name__}: {exc}".strip()[:2000]
        # The trace stays in the worker's log: it may quote a record, and clients get a code and a message.
        return _fail(work.job_id, keeper, Problem(500, "job-failed", "Job failed", detail).body())


def _unlearn(work: Work, source: str, settings: Settings, progress, keeper: LeaseKeeper, tmp: Path,
            store: ArtifactStore):
    """The run: in one process, or, for full fine-tuning on a worker with several GPUs, FSDP over all of them (one
    process each). Returns the typed result and the merged model with its tokenizer (None when cancelled)."""
    import torch

    from lethe.engine.model.loading import load_model, resolve_device
    from lethe.engine.sharded_run import run_sharded
    from lethe.engine.unlearn import unlearn

    params = work.spec.params
    assert params is not None
    gpus = torch.cuda.device_count() if resolve_device(settings.device).type == "cuda" else 0
    if params.lora is False and gpus > 1:  # "auto" runs in one process (update_space)
        document = run_sharded(source, work.forget, work.retain, params=params, processes=gpus, workdir=tmp / "sharded",
                             holdout=work.holdout, device="cuda", progress=progress, should_cancel=keeper.should_stop,
                             format=work.spec.format, memory_limit=settings.device_memory_bytes or None)
        result = UnlearnResult.from_dict(document)  # rank 0's result, typed again
        if not (tmp / "sharded" / "model").is_dir():
            return result, None, None
        model, tokenizer = load_model(tmp / "sharded" / "model", resolve_device(settings.device))
        return result, model, tokenizer
    anchor = None
    if work.anchor is not None:
        number, location = work.anchor
        anchor = str(store.local_path(location) or store.fetch_directory(location, tmp / "anchor"))
    outcome = unlearn(source, work.inputs, params=params, device=settings.device, progress=progress,
                      should_cancel=keeper.should_stop, memory_limit=settings.device_memory_bytes or None,
                      anchor=anchor)
    if outcome.result.anchor is not None:
        outcome.result.anchor = f"version {number}"  # not the worker's temporary path
    return outcome.result, outcome.model, outcome.tokenizer


def model_card(card: dict, result: UnlearnResult) -> str:
    """The checkpoint's README: base model and lineage (SPEC section 7). Request ids, never records."""
    erased = "\n".join(f"- {r}" for r in card["erased"])
    return (f"# {card['model']}: unlearned checkpoint\n\n"
            f"- Base model (lineage root): {card['source']}\n- Parent version: {card['parent']}\n"
            f"- Produced by job: {card['job']} ({result.method}, stop reason {result.stop_reason}, "
            f"{result.steps} steps)\n\nErasure requests applied along this lineage:\n\n{erased}\n")


def _audit_served(work: Work, stored: Path, dtype, placement: dict | None, source: str, store: ArtifactStore,
                  tmp: Path, device: str) -> dict:
    """The audit of the checkpoint as it is served, loaded back from its stored files in its dtype (and placement); a
    load that fails is the audit's failure, recorded, and does not undo the unlearning."""
    import gc

    import torch

    from lethe.engine.model.loading import load_tokenizer, load_weights, resolve_device

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        served = load_weights(stored, resolve_device(device), dtype, placement)
        tokenizer = load_tokenizer(stored)
    except Exception as exc:
        log.exception("the stored checkpoint could not be loaded back")
        return {"error": f"the stored checkpoint could not be loaded back: {type(exc).__name__}: {exc}"[:2000]}
    audit = _audit(work, served, tokenizer, source, store, tmp)
    audit["checked_on"] = {"weights": "the stored checkpoint, loaded back",
                           "dtype": str(next(served.parameters()).dtype).removeprefix("torch.")}
    return audit


def _audit(work: Work, model, tokenizer, source: str, store: ArtifactStore, tmp: Path) -> dict:
    """The evidence; an audit that fails is recorded as such and does not undo the unlearning."""
    from lethe.engine.audit.run import run_audit

    try:
        reference = None
        if work.reference:
            reference = store.local_path(work.reference) or store.fetch_directory(work.reference, tmp / "reference")
        params = work.spec.params
        return run_audit(source, model, tokenizer, work.inputs, options=work.audit_options,
                         reference_source=str(reference) if reference else None,
                         seed=params.seed if params else 0, max_length=params.max_length if params else 0,
                         utility=without_forget(work.utility, work.forget)[0])  # an erased record is no utility
    except Exception as exc:
        log.exception("audit failed")
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def _summary(version: int | None, stop_reason: str, steps: int, wall_seconds: float) -> dict:
    return {"model_version": version, "stop_reason": stop_reason, "steps": steps, "wall_seconds": wall_seconds}


def _finish(work: Work, keeper: LeaseKeeper, result: UnlearnResult, location: str, manifest: list | None,
            audit: dict | None, curves: list[dict]) -> str:
    """One transaction: the version (at most one per job) and the end of every job of the run, if the leases are
    still ours."""
    requeued: list[tuple[str, str | None]] = []
    outcome = while_ours(work.job_id, keeper, lambda session, job: _finish_owned(
        session, job, work, keeper, result, location, manifest, audit, curves, requeued))
    for job_id, queue in requeued:  # after the commit; the sweeper re-sends any this misses
        try:
            enqueue(job_id, queue=queue)
        except Exception:
            log.exception("could not re-send job %s; the sweeper will", job_id)
    return outcome


def _finish_owned(session, job: Job, work: Work, keeper: LeaseKeeper, result: UnlearnResult, location: str,
                  manifest: list | None, audit: dict | None, curves: list[dict],
                  requeued: list[tuple[str, str | None]]) -> str:
    ours = still_ours(keeper.owner)
    others = [owned_job(session, m.job_id, keeper.owner) for m in work.members[1:]]
    jobs = [job, *(j for j in others if j is not None)]
    if keeper.latest_progress is not None:
        for j in jobs:
            j.progress = keeper.latest_progress
    if manifest is None or None in others or any(j.cancel_requested for j in jobs):
        return _stop_run(jobs, work, result, requeued, ours, lost=None in others)
    model = get_model(session, job.tenant, job.model_id)
    parent = get_version(session, model, job.base_version, READABLE)
    existing = session.query(ModelVersion).filter_by(job_id=job.id).one_or_none()
    if existing is None:
        lock_model(session, model.id)
        if missing := missing_erasures(session, parent):  # a version was made from the same base meanwhile
            for j in jobs:
                end_job(j, "FAILED", error=predates(parent.number, missing, "no longer holds every erasure (erased "
                                                    "from it meanwhile); submit again without a version"), **ours)
            return "failed: base version predates erasures"
    erased = list(dict.fromkeys([*parent.erased_request_ids, *(j.request_id for j in jobs)]))  # every member's
    version = existing or add_version(session, model, location=location, manifest=manifest, parent=parent,
                                      job_id=job.id, request_id=job.request_id, erased=erased)
    pruned, retired = 0, []
    if existing is None:
        for j in jobs:
            pruned += prune_model_records(session, model, j.forget_records or [], j.request_id)
        for j in jobs:  # after every member's pruning: no record one of them erased is added back
            erased = [r for other in jobs for r in other.forget_records or []]
            accumulate_model_retain(session, model, without_forget(j.retain_records, erased)[0] or [],
                                    j.request_id, get_settings().max_records)
        retired = retire_predecessors(session, model)
    rows = record_curves(session, job, curves, version.number, version) if curves else []
    mcu = None
    if job.mcu_options:
        mcu = {"curves": [connectivity.summary(r) for r in rows],
               "errors": [{"a": c["a"], "error": c["error"]} for c in curves if "error" in c]}
    document = result.as_dict()
    prefixes = [m.prefix for m in work.members]
    members = [{"job_id": m.job_id, "request_id": m.request_id, "forget_records": m.forget_count}
               for m in work.members]
    for j in jobs:
        own, own_audit = result, audit or {"error": "not run"}
        if work.members:
            prefix = next(m.prefix for m in work.members if m.job_id == j.id)
            own = UnlearnResult.from_dict(member_slice(document, prefix, prefixes))
            own_audit = member_slice(own_audit, prefix, prefixes)
        j.engine_result = own.as_dict()
        j.report = build_report(j, own, own_audit, parent, version, keeper.owner, mcu if j is job else None)
        if work.members:
            j.report["run"] = run_summary(job.id, members, len(work.forget))
        audit_log.append(session, j.tenant, "report.created", j.id,
                         {"report_sha256": j.report["sha256"], "forgotten": j.report["verdict"]["forgotten"]})
        # The log's head, signed with a key the database does not hold: a client that keeps it can later tell a
        # chain cut back or rewritten (POST /v1/audit-log/verify).
        j.report = {**j.report, "audit_checkpoint": audit_log.checkpoint(
            session, audit_log.signing_key(get_settings()))}
        j.examples_until = examples_until(j.report, get_settings().examples_retention_seconds, utcnow())
        summary = _summary(version.number, result.stop_reason, result.steps, result.wall_seconds)
        if work.members:
            summary["run_id"] = job.id
        if retired:
            summary["retired_versions"] = retired
        if pruned:
            summary["retain_records_pruned"] = pruned
        if j is job and job.mcu_options:
            ensembles = [r.ensemble["version"] for r in rows if r.ensemble]
            summary.update(connectivity=[r.id for r in rows], ensemble_version=ensembles[0] if ensembles else None)
        end_job(j, "SUCCEEDED", result=summary, **ours)
    return f"succeeded: version {version.number}"


def _stop_run(jobs: list[Job], work: Work, result: UnlearnResult, requeued: list[tuple[str, str | None]],
              ours: dict, lost: bool) -> str:
    """No version: a job alone ends CANCELLED. In a coalesced run, the members asked to cancel end CANCELLED and the
    others go back to the queue, to run again without them (what was trained held their records too); a member whose
    lease was lost sends the rest back likewise."""
    if not work.members:
        jobs[0].engine_result = result.as_dict()
        end_job(jobs[0], "CANCELLED", result=_summary(None, "cancelled", result.steps, result.wall_seconds), **ours)
        return "cancelled"
    cancelled = [j for j in jobs if j.cancel_requested]
    for j in jobs:
        if j.cancel_requested:
            end_job(j, "CANCELLED", result=_summary(None, "cancelled", result.steps, result.wall_seconds), **ours)
        else:
            requeue(j, "a member of its coalesced run was cancelled" if cancelled else "a member's lease was lost")
            requeued.append((j.id, j.queue))
    return f"stopped: {len(cancelled)} cancelled, {len(jobs) - len(cancelled)} queued again" + \
        (" (a member's lease was lost)" if lost else "")


def _fail(job_id: str, keeper: LeaseKeeper, error: dict) -> str:
    """The job, and every member of its coalesced run, FAILED with the same problem."""
    def fail(session, job: Job) -> str:
        end_job(job, "FAILED", error=error, **still_ours(keeper.owner))
        for member in keeper.members:
            if (other := owned_job(session, member, keeper.owner)) is not None:
                end_job(other, "FAILED", error=error, **still_ours(keeper.owner))
        return "failed"

    return while_ours(job_id, keeper, fail)
