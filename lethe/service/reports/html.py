"""The audit report as one self-contained HTML page (inline SVG, no external assets) for a compliance
officer: the verdict first, then the charts, then the evidence block."""
from __future__ import annotations

import json

from lethe.engine.audit.metrics import metric_value
from lethe.service.reports.charts import bar_chart, histogram, line_chart
from lethe.service.reports.charts import escape as _e
from lethe.service.reports.charts import fmt as _fmt
from lethe.service.reports.connectivity import mcu_section, render_connectivity_report
from lethe.service.reports.matrix import matrix_section
from lethe.service.reports.secrets import degeneration_section, secrets_section


def _target_line(stop: dict) -> str:
    source = stop.get("alpha_source") or {}
    if stop.get("alpha") is None:
        return "none (fixed budget)"
    where = {"auto": "calibrated on the base model's V on counterfactuals of the records",
             "given": "given with the request"}.get(str(source.get("source")), "the request's parameter")
    return f"alpha = {stop['alpha']:.3f}, {where}"


def _erasure_line(stop: dict) -> str:
    erasure, records = stop.get("erasure") or {}, stop.get("per_record") or []
    if not erasure:
        return "not part of this method"
    if not erasure.get("applied"):
        return "not applied (holdout mode: the mean over held-out records decides)"
    failing = erasure.get("failing_ids") or []
    documents = stop.get("documents") or []
    split = (f"; {len(documents)} long documents in {sum(len(d['windows']) for d in documents)} windows, "
             f"{sum(1 for d in documents if d['meets_condition'])} with every window meeting it" if documents else "")
    return (f"{len(records) - len(failing)} of {len(records)} records meet it"
            + (f"; failing: {', '.join(failing[:10])}" if failing else "") + split)


def render_report(report: dict) -> str:
    if report.get("kind") == "connectivity":
        return render_connectivity_report(report)
    v, stop, audit, ev = report["verdict"], report["stop_rule"], report["audit"], report["evidence"]
    checks = [e for e in stop["v_trace"] if e["stage"] == "confirm"] or stop["v_trace"]
    trace = line_chart([("V (trigger)", [e["step"] for e in stop["v_trace"] if e["stage"] == "trigger"],
                         [e["v"] for e in stop["v_trace"] if e["stage"] == "trigger"]),
                        ("V (confirmed)", [e["step"] for e in checks], [e["v"] for e in checks])],
                       "Violation rate V on D_val against alpha",
                       (f"alpha = {stop['alpha']:.3f}", stop["alpha"]) if stop["alpha"] is not None else None)
    losses = stop["loss_trace"]
    loss = line_chart([(name, [p["step"] for p in losses], [p.get(name) for p in losses])
                       for name in ("total", "forget", "retain")], "Losses per step")
    before, after = audit.get("before", {}), audit.get("after", {})
    metric_rows = [(label, metric_value(before, *path), metric_value(after, *path)) for label, path in (
        ("forget exact match", ("forget_verbatim", "exact_match")),
        ("forget ROUGE-L recall", ("forget_verbatim", "rouge_l_recall")),
        ("forget extraction strength", ("forget_verbatim", "extraction_strength")),
        ("forget token accuracy", ("forget_verbatim", "token_accuracy")),
        ("paraphrased ROUGE-L recall", ("forget_knowledge", "rouge_l_recall")),
        ("forget truth-ratio score", ("forget_truth_ratio",)),
        ("model utility (retain)", ("retain_utility", "model_utility")),
        ("MIA AUC (LOSS)", ("membership", "loss")), ("MIA AUC (Min-K%++)", ("membership", "min_k_pp")))]
    utility = audit.get("utility_set") or {}
    if utility.get("value") is not None:  # the model's utility set (issue 28): trained by no run
        metric_rows.append(("model utility (utility set)", utility.get("base_value"), utility["value"]))
    bounds = [r["log10_bound"] for r in (report.get("bound") or {}).get("per_record", [])]
    quant = audit.get("quantization")
    relearn = audit.get("relearning", {})
    relearn_chart = line_chart([("ROUGE-L recall", [p["steps"] for p in relearn["points"]],
                                 [p["rouge_l_recall"] for p in relearn["points"]]),
                                ("exact match", [p["steps"] for p in relearn["points"]],
                                 [p["exact_match"] for p in relearn["points"]])],
                               "Relearning: memorisation of the held-back half after fine-tuning steps") \
        if relearn.get("points") else f"<p>Relearning probe: {_e(relearn.get('reason', 'not run'))}.</p>"
    quant_html = (f"<p>Scheme: {_e(quant['scheme'])}. Change in forget metrics after quantisation: "
                  + ", ".join(f"{_e(k)} {_fmt(val)}" for k, val in quant["change"].items()) + ".</p>") \
        if quant else "<p>Quantisation check: not run.</p>"
    fq, leak = audit.get("forget_quality", {}), (audit.get("privleak") or {}).get("loss", {})
    evidence_rows = {
        "Request id": ev["request_id"],
        "Forget set": f"{ev['forget_count']} records, manifest sha256 {ev['forget_manifest_sha256']}",
        "Base version": f"v{ev['base_version']['number']}, manifest sha256 {ev['base_version']['manifest_sha256']}",
        "New version": (f"v{ev['new_version']['number']}, manifest sha256 {ev['new_version']['manifest_sha256']}"
                        if ev["new_version"] else "none"),
        "Method": f"{ev['method']} (preset {ev['preset'] or 'none'})", "Seed": ev["seed"],
        "Parameters": json.dumps(ev["parameters"], sort_keys=True),
        "Code and libraries": ", ".join(f"{k} {val}" for k, val in ev["versions"].items()),
        "Worker": f"{ev['worker']} on {ev['device']}", "Submitted": ev["created_at"], "Started": ev["started_at"],
        "Stop": f"{stop['stop_reason']} after {stop['steps']} steps, {stop['wall_seconds']:.1f} s"
                + (" (flagged: hit max_steps)" if stop["flagged"] else ""),
        "Stop target": _target_line(stop),
        "Per-record condition": _erasure_line(stop),
        "Forget quality": _fmt(fq.get("value")) + (f" ({_e(fq['reason'])})" if fq.get("reason") else ""),
        "PrivLeak (LOSS)": _fmt(leak.get("value")) + (f" against {_e(leak['reference'])}" if leak.get("reference")
                                                      else f" ({_e(leak.get('reason', 'n/a'))})"),
        "Report sha256": report.get("sha256", ""),
    }
    examples = ""
    generated_after = after.get("forget_verbatim", {}).get("generated")
    if generated_after:  # only when the request asked for examples
        generated_before = before.get("forget_verbatim", {}).get("generated", {})
        examples = ("<section><h2>Examples (requested)</h2><table><tr><td>record</td><td>before</td><td>after</td></tr>"
                    + "".join(f"<tr><td>{_e(k)}</td><td>{_e(generated_before.get(k, ''))}</td><td>{_e(text)}</td></tr>"
                              for k, text in list(generated_after.items())[:20]) + "</table></section>")
    colour = "#1a7f37" if v["forgotten"] else "#b42318"
    return f"""<!doctype html><html lang="en"><head>\
<meta charset="utf-8"><title>Unlearning audit {_e(report['job_id'])}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:24px auto;color:#222}}
.verdict{{border:2px solid {colour};color:{colour};padding:12px 16px;font-size:18px;font-weight:bold}}
table{{border-collapse:collapse;font-size:13px;table-layout:fixed;width:100%}}td:first-child{{width:170px}}\
td{{border:1px solid #ddd;padding:4px 8px;vertical-align:top;word-break:break-all}}
section{{margin-top:22px}}</style></head><body>
<h1>Unlearning audit report</h1>
<div class="verdict" id="verdict">{_e(v['summary'])}</div>
<ul>{''.join(f'<li>{_e(item)}</li>' for item in v['reasons'] + v['evidence'])}</ul>
{matrix_section(v)}
<section><h2>Stop rule</h2>{trace}{loss}</section>
<section><h2>Before and after</h2>\
{bar_chart(metric_rows, 'Metrics of the base (before) and new (after) version')}</section>
<section><h2>Proposition-1 bound per record (log10)</h2>\
{histogram(bounds, 'Records by log10 of the bound on verbatim reproduction')}</section>
{secrets_section(audit)}
{degeneration_section(audit)}
<section><h2>Robustness</h2>{quant_html}{relearn_chart}</section>
{mcu_section(report.get("connectivity"))}
{examples}
<section><h2>Evidence</h2><table id="evidence">\
{''.join(f'<tr><td>{_e(k)}</td><td>{_e(val)}</td></tr>' for k, val in evidence_rows.items())}</table></section>
</body></html>"""
