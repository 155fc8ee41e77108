"""Mode connectivity on a worker (SPEC section 6): the curves an unlearning job asked for, and a connectivity
job on its own. The engine measures; this module fetches versions, stores the ensemble's checkpoint and writes
the curves, the ensemble version and the job's end in one transaction."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lethe.service.domain import audit_log, connectivity
from lethe.service.domain.jobs import end_job, still_ours
from lethe.service.domain.lineage import NOT_FORGOTTEN, add_version, get_model, get_version
from lethe.service.infra.artifacts import ArtifactStore
from lethe.service.infra.tables import Job
from lethe.service.reports.evidence import build_connectivity_report, verdict
from lethe.service.settings import Settings
from lethe.worker.work import LeaseKeeper, Work, time_limit_problem, while_ours

log = logging.getLogger("lethe.worker")
ENSEMBLE_TAG = "mcu-ensemble"


def fetch(store: ArtifactStore, location: str, tmp: Path, name: str) -> str:
    """A version's directory on this machine: the store's own folder, or a copy fetched into tmp."""
    return str(store.local_path(location) or store.fetch_directory(location, tmp / name))


def measure_curves(work: Work, new_dir: str, store: ArtifactStore, tmp: Path, keeper: LeaseKeeper,
                   device: str, audit_of: Callable[[Any, Any], dict] | None = None) -> list[dict]:
    """One curve per version the job named (the first also gets the ensemble when asked), from that version to
    the new one. A failure is recorded per curve and does not undo the unlearning. `audit_of(model, tokenizer)`: the
    job's own audit, run on the ensemble too (issue 25: it earns the request's erasure by its own verdict)."""
    from lethe.engine.connectivity.run import run_connectivity

    assert work.spec.connectivity is not None
    curves: list[dict] = []
    for i, (number, location) in enumerate(work.curves_from.items()):
        params = dataclasses.replace(work.spec.connectivity, ensemble=work.spec.connectivity.ensemble and i == 0)
        try:
            outcome = run_connectivity(fetch(store, location, tmp, f"v{number}"), new_dir, work.inputs, params,
                                       device=device, suppress=number == work.parent,
                                       progress=_progress(keeper), should_cancel=keeper.should_stop)
        except InterruptedError:
            return curves  # cancelled or lease lost; the finish decides what that means
        except Exception as exc:
            log.exception("connectivity against v%s failed", number)
            curves.append({"a": number, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            continue
        curve: dict[str, Any] = {"a": number, "result": outcome.result}
        if outcome.ensemble is not None:
            stored = save_ensemble(outcome, store, tmp, work.folder("ensemble"))
            if audit_of is not None:
                stored["verdict"] = ensemble_verdict(audit_of(outcome.ensemble, outcome.tokenizer))
            curve["ensemble"] = stored
        curves.append(curve)
        del outcome
    return curves


def ensemble_verdict(audit: dict) -> dict:
    """The ensemble's own verdict on the request's records, from its own audit: no stop rule ran on it, so the audit's
    channels decide. Kept with the curve (summary, channels' leaking ids; no text)."""
    judged = verdict({"stop_reason": "ensemble", "steps": 0, "params": {}}, audit)
    return {"forgotten": judged["forgotten"], "summary": judged["summary"],
            "leaking": {c: x["leaking_ids"] for c, x in (judged.get("channels") or {}).items() if x["leaking_ids"]}}


def _progress(keeper: LeaseKeeper):
    def report(p):
        if "fit_step" in p:
            keeper.latest_progress = {"step": p["fit_step"], "max_steps": p["fit_steps"], "losses": p["losses"]}
        else:
            keeper.latest_progress = {"step": p["point"], "max_steps": p["points"]}
    return report


def save_ensemble(outcome, store: ArtifactStore, tmp: Path, location: str) -> dict:
    """Store the MCU ensemble's checkpoint in this attempt's folder; its location and manifest."""
    from lethe.engine.model.loading import save_model

    out = tmp / "ensemble"
    save_model(outcome.ensemble, outcome.tokenizer, out)
    (out / "README.md").write_text("# MCU ensemble\n\nThe weight average of "
                                   f"{outcome.result['ensemble']['points']} interior points of a "
                                   f"{outcome.result['curve']} curve (SPEC section 6).\n")
    return {"location": location, "manifest": store.put_local_directory(out, location)}


def ensemble_erasures(b_erased: list[str], a_erased: list[str], request_id: str | None, judged: dict | None
                      ) -> tuple[list[str], list[str]]:
    """What an ensemble of versions a and b holds, and its tags: of the earlier erasures those both ends hold; this
    job's request only where the ensemble's own verdict is "Forgotten"; a verdict that is not tags it not-forgotten
    (never the head). Unaudited (a connectivity job on its own): what both ends hold, no new erasure."""
    earned = bool(judged and judged["forgotten"])
    erased = [r for r in b_erased if r in set(a_erased) or (earned and r == request_id)]
    return erased, [ENSEMBLE_TAG] + ([NOT_FORGOTTEN] if judged is not None and not earned else [])


def record_curves(session, job: Job, curves: list[dict], b: int, parent_of_ensemble) -> list:
    """Store each measured curve (and the ensemble's version, tagged) inside the caller's transaction."""
    model = get_model(session, job.tenant, job.model_id)
    rows = []
    for curve in curves:
        if "error" in curve:
            continue
        ensemble = None
        if "ensemble" in curve:
            # The ensemble mixes both ends' weights: of the earlier erasures (whose records are gone) it holds those
            # both ends hold; this job's request only where its own audit says "Forgotten". Otherwise it is stored,
            # tagged, and never the head (it lacks the request the new version holds).
            judged = curve["ensemble"].get("verdict")
            erased, tags = ensemble_erasures(parent_of_ensemble.erased_request_ids,
                                             get_version(session, model, curve["a"]).erased_request_ids,
                                             job.request_id, judged)
            version = add_version(session, model, location=curve["ensemble"]["location"],
                                  manifest=curve["ensemble"]["manifest"], parent=parent_of_ensemble, job_id=None,
                                  request_id=None, tags=tags, erased=erased)
            ensemble = {"version": version.number, **curve["result"]["ensemble"],
                        **({"verdict": judged} if judged is not None else {})}
        row = connectivity.store_curve(session, job, curve["a"], b, curve["result"], ensemble)
        audit_log.append(session, job.tenant, "connectivity.measured", row.id,
                         {"job_id": job.id, "a": row.version_a, "b": row.version_b, "curve": row.curve,
                          "mcu_holds": row.mcu_holds, "ensemble_version": ensemble and ensemble["version"]})
        rows.append(row)
    return rows


def execute_connectivity(work: Work, keeper: LeaseKeeper, settings: Settings, store: ArtifactStore,
                         tmp: Path) -> str:
    """A connectivity job: the curve from version a to version b."""
    from lethe.engine.connectivity.run import run_connectivity

    assert work.spec.connectivity is not None and work.curve_to is not None
    [(a, a_location)], (b, b_location) = work.curves_from.items(), work.curve_to
    try:
        outcome = run_connectivity(fetch(store, a_location, tmp, "a"), fetch(store, b_location, tmp, "b"),
                                   work.inputs, work.spec.connectivity, device=settings.device,
                                   progress=_progress(keeper), should_cancel=keeper.should_stop)
    except InterruptedError:
        outcome = None
    if keeper.lost.is_set():
        return "lease lost"
    if keeper.timed_out.is_set():
        return while_ours(work.job_id, keeper, lambda session, job: _time_limit(job, keeper, settings))
    curve = None
    if outcome is not None:
        curve = {"a": a, "result": outcome.result}
        if outcome.ensemble is not None:
            curve["ensemble"] = save_ensemble(outcome, store, tmp, work.folder("ensemble"))

    def finish(session, job: Job) -> str:
        if outcome is None or curve is None or job.cancel_requested:
            end_job(job, "CANCELLED", result={"connectivity": []}, **still_ours(keeper.owner))
            return "cancelled"
        model = get_model(session, job.tenant, job.model_id)
        [row] = record_curves(session, job, [curve], b, get_version(session, model, b))
        job.engine_result = outcome.result
        job.report = build_connectivity_report(job, [connectivity.summary(row)], keeper.owner)
        audit_log.append(session, job.tenant, "report.created", job.id, {"report_sha256": job.report["sha256"]})
        end_job(job, "SUCCEEDED", result={"connectivity": [row.id],
                                          "wall_seconds": outcome.result["timing"]["wall_seconds"],
                                          "ensemble_version": (row.ensemble or {}).get("version")},
                **still_ours(keeper.owner))
        return f"succeeded: {row.id}"

    return while_ours(work.job_id, keeper, finish)


def _time_limit(job: Job, keeper: LeaseKeeper, settings: Settings) -> str:
    end_job(job, "FAILED", error=time_limit_problem(settings.max_job_seconds), **still_ours(keeper.owner))
    return "failed: time limit"
