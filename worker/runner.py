"""One unlearning job on a worker: take the lease, run the engine with heartbeats and cancellation,
store the checkpoint, create the version, end the job. Reads top to bottom."""
from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from pathlib import Path

from sqlalchemy import select

from service import audit_log, connectivity
from service.db import session_scope
from service.jobs import StateChanged, acquire_lease, end_job, fail_exhausted, heartbeat, log_state
from service.models import TERMINAL, Job, ModelVersion, RetrainReference, utcnow
from service.queue import enqueue
from service.registry import add_version, get_model, get_version, lock_model, missing_erasures
from service.report import build_report
from service.settings import get_settings
from service.store import ArtifactStore
from worker.mcu_runner import execute_connectivity, measure_curves, record_curves, version_dirs

log = logging.getLogger("lethe.worker")


class LeaseKeeper(threading.Thread):
    """Renews the lease and publishes progress every heartbeat; notices cancellation and a lost lease."""

    def __init__(self, job_id: str, owner: str):
        super().__init__(name=f"lease-{job_id}", daemon=True)
        self.job_id, self.owner = job_id, owner
        self.settings = get_settings()
        self.latest_progress: dict | None = None
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self.done = threading.Event()

    def beat(self) -> None:
        with session_scope() as session:
            ours, cancel = heartbeat(session, self.job_id, self.owner, self.settings.lease_seconds,
                                     self.latest_progress)
        if not ours:
            self.lost.set()
        if cancel:
            self.cancelled.set()

    def run(self) -> None:
        while not self.done.wait(self.settings.heartbeat_seconds):
            try:
                self.beat()
            except Exception:  # a database hiccup: the lease has slack for a few missed beats
                log.exception("heartbeat failed for job %s", self.job_id)

    def should_stop(self) -> bool:
        return self.cancelled.is_set() or self.lost.is_set()


def problem(kind: str, title: str, status: int, detail: str) -> dict:
    return {"type": f"https://lethe.dev/problems/{kind}", "title": title, "status": status, "detail": detail}


def run(job_id: str) -> str:
    settings = get_settings()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    with session_scope() as session:
        if fail_exhausted(session, job_id):  # every attempt's worker died: FAILED, whatever else runs
            return "failed: attempts exhausted"
        if busy := model_busy(session, job_id):
            enqueue(job_id, countdown=settings.heartbeat_seconds * 2)  # one new version per model at a time
            session.get(Job, job_id).enqueued_at = utcnow()  # this chain re-sends it: the sweeper need not
            return f"waiting for job {busy}"
        if not acquire_lease(session, job_id, owner, settings.lease_seconds):
            return "skipped"  # finished, or running elsewhere: a duplicate delivery does nothing
        job = session.get(Job, job_id)
        if job.state == "CANCELLING":
            end_job(job, "CANCELLED", result=_result(None, "cancelled", 0, 0.0))
            return "cancelled"
        model = get_model(session, job.tenant, job.model_id)
        base = start_version(session, model, job) if job.kind != "connectivity" else \
            get_version(session, model, job.base_version)
        if base is None:
            return "failed: base version predates erasures"
        reference = session.scalar(select(RetrainReference).where(
            RetrainReference.model_id == model.id,
            RetrainReference.forget_manifest_sha256 == job.forget_evidence["manifest_sha256"]))
        reference_location = get_version(session, model, reference.version_number).location if reference else None
        work = dict(forget=job.forget_records, retain=job.retain_records or [], params=job.params,
                    preset=job.preset, method=job.method, location=base.location,
                    holdout=job.holdout_records or [], audit_options=job.audit_options or {},
                    reference_location=reference_location, attempt=job.attempt,
                    card=dict(model=model.name, source=model.source, parent=base.number, job=job.id,
                              erased=[*base.erased_request_ids, job.request_id]))
        if job.kind == "connectivity":
            options = job.mcu_options
            locations = version_dirs(session, job.tenant, job.model_id, [options["a"], options["b"]])
            work = dict(kind="connectivity", forget=job.forget_records or [], retain=job.retain_records or [],
                        mcu=options, a_location=locations[options["a"]], b_location=locations[options["b"]],
                        attempt=job.attempt)
        elif job.mcu_options:
            work.update(mcu=job.mcu_options, parent=base.number,
                        against_locations=version_dirs(session, job.tenant, job.model_id, job.mcu_options["against"]))

    keeper = LeaseKeeper(job_id, owner)
    keeper.start()
    try:
        return _execute(job_id, work, keeper, settings)
    finally:
        keeper.done.set()


def model_busy(session, job_id: str) -> str | None:
    """Another unlearning job of the same model that has started and not ended: this one waits for it, so
    that each new version starts from the one before and holds every erasure (issue 12). A lease that
    expired does not free the model (its worker may only be slow; the sweeper re-sends or fails that job).
    The model's row is locked first, so two workers cannot both find the model free (released when the
    caller's transaction ends)."""
    job = session.get(Job, job_id)
    if job is None or job.kind == "connectivity" or job.state in TERMINAL:
        return None
    lock_model(session, job.model_id)
    return session.scalar(select(Job.id).where(
        Job.model_id == job.model_id, Job.id != job_id, Job.kind != "connectivity",
        Job.state.in_(("RUNNING", "CANCELLING"))).limit(1))


def start_version(session, model, job: Job) -> ModelVersion | None:
    """The version the job starts from: the head now, where the request named none; else the named one,
    which must still hold every erasure done on the model (else the job FAILS, saying which)."""
    if job.follows_head:
        base = get_version(session, model, None)
        if base.number != job.base_version:
            job.base_version = base.number
            log_state(job, {"base_version": base.number, "reason": "the head moved since submission"})
        return base
    base = get_version(session, model, job.base_version)
    if missing := missing_erasures(session, base):
        end_job(job, "FAILED", error=problem(
            "version-predates-erasures", "Version predates erasures", 409,
            f"version {base.number} still holds data erased by request(s) {', '.join(missing[:10])} (erased since "
            "this job was submitted); submit again without a version to start from the head"))
        return None
    return base


def _execute(job_id: str, work: dict, keeper: LeaseKeeper, settings) -> str:
    from worker.engine.errors import EngineInputError
    from worker.engine.loading import save_model
    from worker.engine.params import params_for
    from worker.engine.unlearn import run_unlearning

    store = ArtifactStore(settings.artifact_root)
    try:
        with tempfile.TemporaryDirectory(prefix="lethe-") as tmp:
            if work.get("kind") == "connectivity":
                return execute_connectivity(job_id, work, keeper, settings, store, Path(tmp))
            source = store.local_path(work["location"]) or store.fetch_directory(work["location"], Path(tmp) / "base")
            params = params_for(work["method"], work["params"], preset=work["preset"])

            def progress(p):
                keeper.latest_progress = {k: p[k] for k in ("step", "max_steps", "violation_rate", "losses")}

            outcome = run_unlearning(str(source), work["forget"], work["retain"], holdout=work["holdout"],
                                     params=params, method=work["method"], device=settings.device,
                                     progress=progress, should_cancel=keeper.should_stop)
            if keeper.lost.is_set():
                return "lease lost"  # another worker owns the job now; write nothing
            # Each attempt writes its own folder: a worker that lost its lease but still runs cannot
            # overwrite the files of its successor, whose version points at its own folder.
            location = f"jobs/{job_id}/attempt-{work['attempt']}/model"
            manifest, audit, curves = None, None, []
            if outcome.model is not None:
                save_model(outcome.model, outcome.tokenizer, Path(tmp) / "out")
                (Path(tmp) / "out" / "README.md").write_text(model_card(work["card"], outcome.result))
                manifest = store.put_local_directory(Path(tmp) / "out", location)
                audit = _audit(work, outcome, str(source), store, Path(tmp), params.seed)
                if work.get("mcu"):
                    outcome.model = None  # the curves load both ends themselves
                    curves = measure_curves(work, str(Path(tmp) / "out"), store, Path(tmp), keeper,
                                            settings.device, job_id)
            finished = _finish(job_id, keeper, outcome.result, location, manifest, audit, curves)
            if finished == "lease lost" and manifest is not None:
                store.delete(f"jobs/{job_id}/attempt-{work['attempt']}")  # nothing points at it
            return finished
    except EngineInputError as exc:
        return _fail(job_id, keeper, problem("invalid-request", "Invalid request", 422, str(exc)))
    except Exception as exc:
        log.exception("job %s failed", job_id)
        detail = f"{type(exc).__name__}: {exc}".strip()[:2000]
        # The trace stays in the worker's log: it may quote a record, and clients get a code and a message.
        return _fail(job_id, keeper, problem("job-failed", "Job failed", 500, detail))


def model_card(card: dict, result: dict) -> str:
    """The checkpoint's README: base model and lineage (SPEC section 7). Request ids, never records."""
    erased = "\n".join(f"- {r}" for r in card["erased"])
    return (f"# {card['model']}: unlearned checkpoint\n\n"
            f"- Base model (lineage root): {card['source']}\n- Parent version: {card['parent']}\n"
            f"- Produced by job: {card['job']} ({result['method']}, stop reason {result['stop_reason']}, "
            f"{result['steps']} steps)\n\nErasure requests applied along this lineage:\n\n{erased}\n")


def _audit(work: dict, outcome, source: str, store: ArtifactStore, tmp: Path, seed: int) -> dict:
    """The evidence; an audit that fails is recorded as such and does not undo the unlearning."""
    from worker.engine.audit_run import run_audit

    try:
        reference = None
        if work["reference_location"]:
            reference = store.local_path(work["reference_location"]) or \
                store.fetch_directory(work["reference_location"], tmp / "reference")
        return run_audit(source, outcome.model, outcome.tokenizer, work["forget"], work["retain"], work["holdout"],
                         options=work["audit_options"], reference_source=str(reference) if reference else None,
                         seed=seed)
    except Exception as exc:
        log.exception("audit failed")
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def _result(version: int | None, stop_reason: str, steps: int, wall_seconds: float) -> dict:
    return {"model_version": version, "stop_reason": stop_reason, "steps": steps, "wall_seconds": wall_seconds}


def _finish(job_id: str, keeper: LeaseKeeper, result: dict, location: str, manifest: list | None,
            audit: dict | None, curves: list[dict]) -> str:
    """One transaction: the version (at most one per job) and the job's end, if the lease is still ours."""
    keeper.done.set()
    try:
        return _finish_once(job_id, keeper, result, location, manifest, audit, curves)
    except StateChanged:  # cancelled, failed by the sweeper or taken over between our read and our write
        return "lease lost"


def _finish_once(job_id: str, keeper: LeaseKeeper, result: dict, location: str, manifest: list | None,
                 audit: dict | None, curves: list[dict]) -> str:
    ours = dict(expected=("RUNNING", "CANCELLING"), conditions=(Job.lease_owner == keeper.owner,))
    with session_scope() as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job.lease_owner != keeper.owner or job.state not in ("RUNNING", "CANCELLING"):
            return "lease lost"
        job.engine_result = result
        if keeper.latest_progress is not None:
            job.progress = keeper.latest_progress
        if manifest is None or job.cancel_requested:
            end_job(job, "CANCELLED", result=_result(None, "cancelled", result["steps"], result["wall_seconds"]),
                    **ours)
            return "cancelled"
        model = get_model(session, job.tenant, job.model_id)
        parent = get_version(session, model, job.base_version)
        existing = session.query(ModelVersion).filter_by(job_id=job_id).one_or_none()
        if existing is None:
            lock_model(session, model.id)
            if missing := missing_erasures(session, parent):  # a version was made from the same base meanwhile
                end_job(job, "FAILED", error=problem(
                    "version-predates-erasures", "Version predates erasures", 409,
                    f"version {parent.number} no longer holds every erasure (request(s) {', '.join(missing[:10])} "
                    "were erased from it meanwhile); submit again without a version"), **ours)
                return "failed: base version predates erasures"
        version = existing or add_version(session, model, location=location, manifest=manifest, parent=parent,
                                          job_id=job_id, request_id=job.request_id)
        rows = record_curves(session, job, curves, version.number, version) if curves else []
        ids = [r.id for r in rows]
        mcu = None
        if job.mcu_options:
            mcu = {"curves": [connectivity.summary(r) for r in rows],
                   "errors": [{"a": c["a"], "error": c["error"]} for c in curves if "error" in c]}
        job.report = build_report(job, result, audit or {"error": "not run"}, parent, version, keeper.owner, mcu)
        audit_log.append(session, job.tenant, "report.created", job.id,
                         {"report_sha256": job.report["sha256"], "forgotten": job.report["verdict"]["forgotten"]})
        # The log's head, signed with a key the database does not hold: a client that keeps it can later
        # tell a chain cut back or rewritten (POST /v1/audit-log/verify).
        job.report = {**job.report, "audit_checkpoint": audit_log.checkpoint(
            session, audit_log.signing_key(get_settings()))}
        summary = _result(version.number, result["stop_reason"], result["steps"], result["wall_seconds"])
        if job.mcu_options:
            ensembles = [r.ensemble["version"] for r in rows if r.ensemble]
            summary.update(connectivity=ids, ensemble_version=ensembles[0] if ensembles else None)
        end_job(job, "SUCCEEDED", result=summary, **ours)
        return f"succeeded: version {version.number}"


def _fail(job_id: str, keeper: LeaseKeeper, error: dict) -> str:
    keeper.done.set()
    try:
        with session_scope() as session:
            job = session.get(Job, job_id, with_for_update=True)
            if job.lease_owner != keeper.owner:
                return "lease lost"
            end_job(job, "FAILED", error=error, expected=("RUNNING", "CANCELLING"),
                    conditions=(Job.lease_owner == keeper.owner,))
    except StateChanged:
        return "lease lost"
    return "failed"
