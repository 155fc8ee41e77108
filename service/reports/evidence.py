"""The audit report of one job (issue 4): a verdict with the evidence behind it, the stop-rule trace,
every metric before and after, and the evidence block. JSON for machines; service.reports.html renders it."""
from __future__ import annotations

from service.domain.jobs import canonical_sha256
from service.infra.tables import Job, ModelVersion
from worker.engine.metrics import metric_value

EXACT_MATCH_LIMIT = 0.1  # the share of forget records a "forgotten" model may still reproduce verbatim


def verdict(engine: dict, audit: dict) -> dict:
    """Forgotten when the stop rule fired and verbatim reproduction is gone, also after 4-bit quantisation."""
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
    elif engine["stop_reason"] == "budget":  # a baseline: no stop rule, the verbatim evidence decides
        evidence.append(f"{engine.get('method', 'baseline')} ran its fixed budget of {engine['steps']} steps")
    else:
        reasons.append(f"the stop rule did not fire (stop reason {engine['stop_reason']})")
    if erasure.get("applied"):
        total = len(engine.get("per_record") or [])
        if erasure.get("failing_ids"):
            reasons.append(f"{len(erasure['failing_ids'])} of {total} records do not meet the per-record condition "
                           f"(ids: {', '.join(erasure['failing_ids'][:10])})")
        elif "judged_violation_rate" in erasure:  # some records judged by their located content
            evidence.append(f"every record ({total}) meets the per-record condition: not reproduced by greedy "
                            "decoding; where its content is located, no content span said (sampled or greedily) and "
                            "its own answers neither give content back nor loop; elsewhere below its ceiling")
        else:
            evidence.append(f"every record ({total}) is below its ceiling and not reproduced by greedy decoding")
        if documents := engine.get("documents"):  # a long document counts as erased when every window is
            windows = sum(len(d["windows"]) for d in documents)
            evidence.append(f"{len(documents)} long documents were split into {windows} windows, each judged as a "
                            "record")
    if "error" in audit:
        reasons.append(f"the audit failed: {audit['error']}")
    else:
        before = metric_value(audit, "before", "forget_verbatim", "exact_match")
        after = metric_value(audit, "after", "forget_verbatim", "exact_match")
        line = f"verbatim exact match on the forget set {before:.0%} -> {after:.0%}"
        (evidence if after <= EXACT_MATCH_LIMIT else reasons).append(line)
        quantized = metric_value(audit, "quantization", "forget_verbatim", "exact_match")
        if quantized is not None:
            line = f"after 4-bit quantisation {quantized:.0%}"
            (evidence if quantized <= EXACT_MATCH_LIMIT else reasons).append(line)
        secret_lines(audit, evidence, reasons)
        quality = audit.get("forget_quality", {})
        if quality.get("value") is not None:
            evidence.append(f"forget quality (KS p-value against the retrain reference) {quality['value']:.3g}")
    bound = engine.get("bound", {}).get("aggregate", {})
    if bound.get("max_bound") is not None:
        evidence.append(f"Proposition-1 bound on verbatim reproduction of any one record <= {bound['max_bound']:.3g}"
                        + ("" if bound.get("guaranteed") else " (not guaranteed: beta != 1)"))
    forgotten = not reasons
    return {"forgotten": forgotten,
            "summary": (("Forgotten: " if forgotten else "Not established: ")
                        + "; ".join(evidence if forgotten else reasons)),
            "evidence": evidence, "reasons": reasons}


def secret_lines(audit: dict, evidence: list[str], reasons: list[str]) -> None:
    """The extraction audit's part of the verdict: no secret said greedily (by the model or its 4-bit copy)
    by more than secret_greedy_max of the records, none in more than secret_sampled_max of the samples.
    Leaking records are named by id only."""
    secrets = (audit.get("after") or {}).get("forget_secrets")
    if secrets is None:  # an audit from before the extraction audit existed
        return
    options = audit.get("options") or {}
    greedy_max = options.get("secret_greedy_max", 0.0)
    sampled_max = options.get("secret_sampled_max", 0.01)
    greedy, sampled = secrets.get("greedy", {}), secrets.get("sampled", {})
    if greedy.get("value") is None:
        evidence.append(f"no secret to extract ({greedy.get('reason', 'none given or found')})")
        return
    before = metric_value(audit, "before", "forget_secrets", "greedy")
    checks = [("greedy decoding", greedy, greedy_max, "of the records", before),
              ("4-bit quantised, greedy", (audit.get("quantization") or {}).get("forget_secrets") or {}, greedy_max,
               "of the records", None),
              ("sampling", sampled, sampled_max, "of the samples",
               metric_value(audit, "before", "forget_secrets", "sampled"))]
    for name, figure, limit, unit, was in checks:
        value = figure.get("value")
        if value is None:
            if figure.get("reason"):
                evidence.append(f"secrets under {name}: not measured ({figure['reason']})")
            continue
        line = (f"secrets extracted under {name}: " + (f"{was:.0%} -> " if was is not None else "")
                + f"{value:.1%} {unit} (at most {limit:.0%} allowed)")
        if value <= limit + 1e-12:
            evidence.append(line)
        else:
            ids = figure.get("leaking_ids") or []
            reasons.append(line + f"; leaking records: {', '.join(ids[:10])}" + (" ..." if len(ids) > 10 else ""))


def target_alpha(engine: dict):
    """The alpha the rule used: calibrated or given (engine 2), else the parameter (older results)."""
    resolved = engine.get("alpha")
    return resolved["value"] if isinstance(resolved, dict) else engine["params"].get("alpha")


def build_report(job: Job, engine: dict, audit: dict, base: ModelVersion, new: ModelVersion | None,
                 worker: str, connectivity: dict | None = None) -> dict:
    report = {
        "job_id": job.id, "verdict": verdict(engine, audit),
        "stop_rule": {"stop_reason": engine["stop_reason"], "steps": engine["steps"],
                      "alpha": target_alpha(engine), "alpha_source": engine.get("alpha"),
                      "erasure": engine.get("erasure"), "per_record": engine.get("per_record"),
                      # long documents split into windows: per document, its windows and whether all meet the rule
                      "documents": engine.get("documents", []), "format": engine.get("format", "plain"),
                      "final_violation_rate": engine["final_violation_rate"],
                      "v_trace": engine["v_trace"], "loss_trace": engine["loss_trace"],
                      "wall_seconds": engine["wall_seconds"], "validation": engine["validation"],
                      "flagged": engine["stop_reason"] == "max_steps"},
        "bound": engine.get("bound"),
        "audit": audit,
        "evidence": {
            "request_id": job.request_id, "forget_manifest_sha256": job.forget_evidence["manifest_sha256"],
            "forget_count": job.forget_evidence["count"],
            "base_version": {"number": base.number, "manifest_sha256": base.manifest_sha256},
            "new_version": {"number": new.number, "manifest_sha256": new.manifest_sha256} if new else None,
            "method": job.method, "preset": job.preset, "parameters": engine["params"], "seed": engine["seed"],
            "versions": engine["versions"], "worker": worker, "device": engine["device"],
            "created_at": job.created_at.isoformat(),
            "started_at": job.started_at.isoformat() if job.started_at else None,
        },
    }
    if connectivity is not None:
        report["connectivity"] = connectivity
    report["sha256"] = canonical_sha256(report)
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
    report["sha256"] = canonical_sha256(report)
    return report
