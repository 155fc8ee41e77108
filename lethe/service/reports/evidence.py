"""The audit report of one job (issue 4): a verdict with the evidence behind it, the stop-rule trace,
every metric before and after, and the evidence block. JSON for machines; lethe.service.reports.html renders it."""
from __future__ import annotations

from lethe.engine.audit.metrics import metric_value
from lethe.engine.audit.verdict import RULE, judge, verdict_lines
from lethe.engine.training.result import UnlearnResult
from lethe.service.domain.report_examples import report_sha256
from lethe.service.infra.tables import Job, ModelVersion


def verdict(engine: dict, audit: dict) -> dict:
    """The verdict, derived by lethe.engine.audit.verdict's one rule from the per-record table: "Forgotten" only when
    the stop rule fired (or a baseline ran its budget), the audit ran, and no record leaks on any channel measured."""
    reasons, evidence = [], []
    alpha = target_alpha(engine)
    erasure = engine.get("erasure") or {}
    if engine["stop_reason"] == "alpha":
        source = (engine.get("alpha") or {}).get("source")
        calibrated = " (calibrated on theta_0)" if source == "auto" else ""
        if "judged_violation_rate" not in erasure:
            evidence.append(f"stop rule fired: V = {engine['final_violation_rate']:.3f} <= alpha = {alpha:.3f}"
                            + calibrated)
        elif erasure["judged_violation_rate"] is None:  # content located on every record: decided by it
            evidence.append("stop rule fired: every record's located content meets its conditions (the mean V is "
                            "not judged: each record keeps its template, as a model that never saw it would)")
        else:
            evidence.append(f"stop rule fired: V = {erasure['judged_violation_rate']:.3f} over the "
                            f"{erasure['judged_records']} records suppressed whole <= alpha = {alpha:.3f}{calibrated}; "
                            "the others' located content meets its conditions")
    elif engine["stop_reason"] == "ensemble":  # an MCU ensemble: weights averaged, no rule ran on them
        evidence.append("an MCU ensemble: no stop rule ran on it; its own audit decides")
    elif engine["stop_reason"] == "budget":  # a baseline: no stop rule, the audit decides
        evidence.append(f"{engine.get('method', 'baseline')} ran its fixed budget of {engine['steps']} steps")
    else:
        reasons.append(f"the stop rule did not fire (stop reason {engine['stop_reason']})")
    if erasure.get("applied"):
        condition_line(engine, evidence)
    judged = None
    if "error" in audit:
        reasons.append(f"the audit failed: {audit['error']}")
        rule = judge(engine, {})["channels"]["rule"]  # the records the rule itself found failing, still named
        reasons += verdict_lines({"rule": rule})[1]
    else:
        judged = judge(engine, audit)
        lines, blocking = verdict_lines(judged["channels"])
        evidence += lines
        reasons += blocking
        before = metric_value(audit, "before", "forget_verbatim", "exact_match")
        after = metric_value(audit, "after", "forget_verbatim", "exact_match")
        if before is not None and after is not None:
            evidence.append(f"verbatim exact match on the forget set {before:.0%} -> {after:.0%}")
        quality = audit.get("forget_quality", {})
        if quality.get("value") is not None:
            evidence.append(f"forget quality (KS p-value against the retrain reference) {quality['value']:.3g}")
    bound = engine.get("bound", {}).get("aggregate", {})
    if bound.get("max_bound") is not None:
        # A bound on teacher-forced probabilities of the saved weights, not on what an extraction attack finds.
        evidence.append("Proposition-1 bound on the saved checkpoint's teacher-forced probability of any one record "
                        f"<= {bound['max_bound']:.3g}" + ("" if bound.get("guaranteed") else " (not guaranteed: "
                                                          "beta != 1)") + "; it does not bound sampling or extraction")
    forgotten = not reasons
    out = {"forgotten": forgotten,
           "summary": (("Forgotten: " if forgotten else "Not established: ")
                       + "; ".join(evidence if forgotten else reasons)),
           "evidence": evidence, "reasons": reasons, "rule": RULE}
    if judged is not None:
        out.update(records=judged["rows"], channels=judged["channels"], floors=judged["floors"],
                   thresholds=judged["options"])
    return out


def condition_line(engine: dict, evidence: list[str]) -> None:
    """What the per-record condition checked, by how each record was judged, and where (the saved checkpoint)."""
    erasure, per_record = engine.get("erasure") or {}, engine.get("per_record") or []
    total, failing = len(per_record), erasure.get("failing_ids") or []
    located = sum(1 for r in per_record if r.get("content_spans") or r.get("content_tokens"))
    parts = []
    if located:
        parts.append(f"{located} judged by their located content (no content span said, sampled or greedily; "
                     "their own answers neither give content back nor loop)")
    if total - located:
        parts.append(f"{total - located} below their ceiling")
    line = (f"{total - len(failing)} of {total} records meet the per-record condition, none reproduced by greedy "
            f"decoding: " + "; ".join(parts))
    served = erasure.get("served_checks") or []
    if served and served[-1].get("passed"):
        line += f"; checked again on the saved checkpoint ({served[-1].get('dtype')})"
    elif engine.get("stop_reason") == "alpha":
        line += "; judged on the training policy, not re-checked on the saved checkpoint"
    evidence.append(line)
    if documents := engine.get("documents"):  # a long document counts as erased when every window is
        windows = sum(len(d["windows"]) for d in documents)
        evidence.append(f"{len(documents)} long documents were split into {windows} windows, each judged as a record")


def target_alpha(engine: dict):
    """The alpha the rule used: calibrated or given (engine 2), else the parameter (older results)."""
    resolved = engine.get("alpha")
    return resolved["value"] if isinstance(resolved, dict) else engine["params"].get("alpha")


def build_report(job: Job, result: UnlearnResult, audit: dict, base: ModelVersion, new: ModelVersion | None,
                 worker: str, connectivity: dict | None = None) -> dict:
    """The report of one unlearning job, from its typed result (the verdict's rule reads the result document, as
    the benchmarks do)."""
    rule, measured = result.rule, result.measured
    report = {
        "job_id": job.id, "verdict": verdict(result.as_dict(), audit),
        "stop_rule": {"stop_reason": result.stop_reason, "steps": result.steps,
                      "alpha": result.alpha, "alpha_source": rule.alpha if rule else None,
                      "erasure": rule.erasure if rule else None, "per_record": measured.per_record,
                      # long documents split into windows: per document, its windows and whether all meet the rule
                      "documents": result.documents, "format": result.format,
                      "final_violation_rate": measured.final_violation_rate,
                      "v_trace": measured.v_trace, "loss_trace": result.loss_trace,
                      "wall_seconds": result.wall_seconds, "validation": measured.validation,
                      "flagged": result.stop_reason == "max_steps"},
        "bound": measured.bound,
        "audit": audit,
        "evidence": {
            "request_id": job.request_id, "forget_manifest_sha256": job.forget_evidence["manifest_sha256"],
            "forget_count": job.forget_evidence["count"],
            "base_version": {"number": base.number, "manifest_sha256": base.manifest_sha256},
            "new_version": {"number": new.number, "manifest_sha256": new.manifest_sha256} if new else None,
            "method": job.method, "preset": job.preset, "parameters": result.params, "seed": result.seed,
            "versions": result.versions, "worker": worker, "device": result.device,
            # what the retain term kept the model close to (issue 28): a fixed version, or the base itself
            "retain_anchor": result.anchor or f"version {base.number} (the base)",
            "created_at": job.created_at.isoformat(),
            "started_at": job.started_at.isoformat() if job.started_at else None,
        },
    }
    if connectivity is not None:
        report["connectivity"] = connectivity
    report["sha256"] = report_sha256(report)
    return report


def mcu_line(curve: dict) -> str:
    """One sentence on one curve: whether MCU holds, and the barriers behind it."""
    name = f"v{curve['a']} -> v{curve['b']} ({curve['curve']})"
    if curve["mcu_holds"] is None:
        return f"{name}: MCU not judged ({curve.get('reason') or 'a barrier is missing'})"
    def nats(value):
        return "n/a" if value is None else f"{value:.3f}"
    return (f"{name}: MCU {'holds' if curve['mcu_holds'] else 'does not hold'}: retain barrier "
            f"{nats(curve['b_retain'])} nats, forget barrier {nats(curve['b_forget'])} nats "
            f"(tolerance {curve['tolerance']})")


def build_connectivity_report(job: Job, curves: list[dict], worker: str) -> dict:
    """The report of a connectivity job: the curve, its barriers and analysis, the evidence."""
    options = job.mcu_options or {}
    report = {"job_id": job.id, "kind": "connectivity",
              "verdict": {"mcu_holds": curves[0]["mcu_holds"] if curves else None,
                          "summary": "; ".join(mcu_line(c) for c in curves) or "no curve was measured"},
              "connectivity": {"curves": curves, "errors": []},
              "evidence": {"request_id": job.request_id, "a": options.get("a"), "b": options.get("b"),
                           "forget_manifest_sha256": job.forget_evidence["manifest_sha256"],
                           "forget_count": job.forget_evidence["count"], "options": options, "worker": worker,
                           "created_at": job.created_at.isoformat(),
                           "started_at": job.started_at.isoformat() if job.started_at else None}}
    report["sha256"] = report_sha256(report)
    return report
