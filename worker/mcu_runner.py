"""Mode connectivity on a worker (SPEC section 6): the curves an unlearning job asked for, and a
connectivity job on its own. The engine measures; this module fetches versions, stores the ensemble's
checkpoint and writes the curves, the ensemble version and the job's end in one transaction."""
from __future__ import annotations

import logging
from pathlib import Path

from service import audit_log, connectivity
from service.db import session_scope
from service.jobs import StateChanged, end_job
from service.models import Job
from service.registry import add_version, get_model, get_version
from service.report import build_connectivity_report
from service.store import ArtifactStore

log = logging.getLogger("lethe.worker")
ENSEMBLE_TAG = "mcu-ensemble"


def version_dirs(session, tenant: str, model_id: str, numbers: list[int]) -> dict[int, str]:
    """Store locations of the named versions, read inside the caller's transaction."""
    model = get_model(session, tenant, model_id)
    return {n: get_version(session, model, n).location for n in numbers}


def fetch(store: ArtifactStore, location: str, tmp: Path, name: str) -> str:
    return str(store.local_path(location) or store.fetch_directory(location, tmp / name))


def measure_curves(work: dict, new_dir: str, store: ArtifactStore, tmp: Path, keeper, device: str,
                   job_id: str) -> list[dict]:
    """One curve per version named in `against` (the first also gets the ensemble when asked), from that
    version to the new one. A failure is recorded per curve and does not undo the unlearning."""
    from worker.engine.mcu.params import McuParams
    from worker.engine.mcu.run import run_connectivity

    options, curves = work["mcu"], []
    for i, number in enumerate(options["against"]):
        values = connectivity.engine_values(options)
        values["ensemble"] = bool(values.get("ensemble")) and i == 0
        try:
            outcome = run_connectivity(fetch(store, work["against_locations"][number], tmp, f"v{number}"), new_dir,
                                       work["forget"], work["retain"], McuParams.from_dict(values), device=device,
                                       suppress=number == work["parent"], progress=_progress(keeper),
                                       should_cancel=keeper.should_stop)
        except InterruptedError:
            return curves  # cancelled or lease lost; the finish decides what that means
        except Exception as exc:
            log.exception("connectivity against v%s failed", number)
            curves.append({"a": number, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            continue
        curve = {"a": number, "result": outcome.result}
        if outcome.ensemble is not None:
            curve["ensemble"] = save_ensemble(outcome, store, tmp, f"jobs/{job_id}/attempt-{work['attempt']}/ensemble")
        curves.append(curve)
        del outcome
    return curves


def _progress(keeper):
    def report(p):
        if "fit_step" in p:
            keeper.latest_progress = {"step": p["fit_step"], "max_steps": p["fit_steps"], "losses": p["losses"]}
        else:
            keeper.latest_progress = {"step": p["point"], "max_steps": p["points"]}
    return report


def save_ensemble(outcome, store: ArtifactStore, tmp: Path, location: str) -> dict:
    from worker.engine.loading import save_model

    out = tmp / "ensemble"
    save_model(outcome.ensemble, outcome.tokenizer, out)
    (out / "README.md").write_text("# MCU ensemble\n\nThe weight average of "
                                   f"{outcome.result['ensemble']['points']} interior points of a "
                                   f"{outcome.result['curve']} curve (SPEC section 6).\n")
    return {"location": location, "manifest": store.put_local_directory(out, location)}


def record_curves(session, job: Job, curves: list[dict], b: int, parent_of_ensemble) -> list:
    """Store each measured curve (and the ensemble's version, tagged) inside the caller's transaction."""
    model = get_model(session, job.tenant, job.model_id)
    rows = []
    for curve in curves:
        if "error" in curve:
            continue
        ensemble = None
        if "ensemble" in curve:
            # The ensemble mixes both ends' weights: it holds only the erasures both ends hold.
            a_erased = set(get_version(session, model, curve["a"]).erased_request_ids)
            version = add_version(session, model, location=curve["ensemble"]["location"],
                                  manifest=curve["ensemble"]["manifest"], parent=parent_of_ensemble, job_id=None,
                                  request_id=None, tags=[ENSEMBLE_TAG],
                                  erased=[r for r in parent_of_ensemble.erased_request_ids if r in a_erased])
            ensemble = {"version": version.number, **curve["result"]["ensemble"]}
        row = connectivity.store_curve(session, job, curve["a"], b, curve["result"], ensemble)
        audit_log.append(session, job.tenant, "connectivity.measured", row.id,
                         {"job_id": job.id, "a": row.version_a, "b": row.version_b, "curve": row.curve,
                          "mcu_holds": row.mcu_holds, "ensemble_version": ensemble and ensemble["version"]})
        rows.append(row)
    return rows


def execute_connectivity(job_id: str, work: dict, keeper, settings, store: ArtifactStore, tmp: Path) -> str:
    """A connectivity job: the curve from version a to version b."""
    from worker.engine.mcu.params import McuParams
    from worker.engine.mcu.run import run_connectivity

    options = work["mcu"]
    try:
        outcome = run_connectivity(fetch(store, work["a_location"], tmp, "a"),
                                   fetch(store, work["b_location"], tmp, "b"),
                                   work["forget"] or None, work["retain"],
                                   McuParams.from_dict(connectivity.engine_values(options)), device=settings.device,
                                   progress=_progress(keeper), should_cancel=keeper.should_stop)
    except InterruptedError:
        outcome = None
    if keeper.lost.is_set():
        return "lease lost"
    curve = None
    if outcome is not None:
        curve = {"a": options["a"], "result": outcome.result}
        if outcome.ensemble is not None:
            curve["ensemble"] = save_ensemble(outcome, store, tmp, f"jobs/{job_id}/attempt-{work['attempt']}/ensemble")
    keeper.done.set()
    ours = dict(expected=("RUNNING", "CANCELLING"), conditions=(Job.lease_owner == keeper.owner,))
    try:
        with session_scope() as session:
            job = session.get(Job, job_id, with_for_update=True)
            if job.lease_owner != keeper.owner or job.state not in ("RUNNING", "CANCELLING"):
                return "lease lost"
            if curve is None or job.cancel_requested:
                end_job(job, "CANCELLED", result={"connectivity": []}, **ours)
                return "cancelled"
            model = get_model(session, job.tenant, job.model_id)
            [row] = record_curves(session, job, [curve], options["b"], get_version(session, model, options["b"]))
            ids = [row.id]
            job.engine_result = outcome.result
            job.report = build_connectivity_report(job, [connectivity.summary(row)], keeper.owner)
            audit_log.append(session, job.tenant, "report.created", job.id, {"report_sha256": job.report["sha256"]})
            end_job(job, "SUCCEEDED", result={"connectivity": ids,
                                              "wall_seconds": outcome.result["timing"]["wall_seconds"],
                                              "ensemble_version": (row.ensemble or {}).get("version")}, **ours)
            return f"succeeded: {ids[0]}"
    except StateChanged:  # cancelled or taken over between our read and our write
        return "lease lost"
