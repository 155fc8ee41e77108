"""The mode-connectivity section of the HTML report (SPEC section 6): per curve, retain and forget loss
along t with the straight line between the endpoint losses for reference, the barriers, the
suppress-first analysis and the ensemble; and the page of a connectivity job on its own."""
from __future__ import annotations

import json

from lethe.service.reports.charts import escape as _e
from lethe.service.reports.charts import fmt as _fmt
from lethe.service.reports.charts import line_chart
from lethe.service.reports.evidence import mcu_line


def curve_section(curve: dict) -> str:
    ts = [p["t"] for p in curve["points"]]
    line = curve.get("line") or []
    charts = []
    for key, label in (("retain_nll", "retain NLL"), ("forget_nll", "forget NLL")):
        if all(key in p for p in curve["points"]):
            charts.append(line_chart([(label, ts, [p[key] for p in curve["points"]]),
                                      ("endpoint line", [r["t"] for r in line], [r.get(f"{key}_line") for r in line])],
                                     f"{label} along t (v{curve['a']} at t = 0, v{curve['b']} at t = 1)"))
    if all("rouge_l" in p for p in curve["points"]):
        series = [("verbatim ROUGE-L", ts, [p["rouge_l"] for p in curve["points"]]),
                  ("violation rate V", ts, [p.get("violation_rate") for p in curve["points"]])]
        if all("knowledge_rouge_l" in p for p in curve["points"]):
            series.append(("knowledge ROUGE-L", ts, [p["knowledge_rouge_l"] for p in curve["points"]]))
        charts.append(line_chart(series, "Forget memorisation along t"))
    facts = [mcu_line(curve)]
    suppress = curve.get("suppress_first")
    if suppress:
        if suppress.get("first"):
            facts.append(f"suppress-first: verbatim memorisation falls at t = {_fmt(suppress['verbatim']['t'])}, "
                         f"knowledge at t = {_fmt(suppress['knowledge']['t'])}: {suppress['first']} first")
        else:
            why = [str(s.get("reason")) for s in (suppress.get("verbatim") or {}, suppress.get("knowledge") or {})
                   if s.get("reason")] or [str(suppress.get("reason", "not measured"))]
            facts.append("suppress-first: not determined (" + "; ".join(why) + ")")
    ensemble = curve.get("ensemble")
    if ensemble:
        facts.append(f"MCU ensemble stored as version {ensemble['version']} (average of {ensemble['points']} "
                     f"interior points): " + json.dumps(ensemble.get("evaluation", {}), sort_keys=True))
    items = "".join(f"<li>{_e(f)}</li>" for f in facts)
    return f'<div class="mcu-curve" id="mcu-{_e(curve["id"])}"><ul>{items}</ul>{"".join(charts)}</div>'


def mcu_section(connectivity: dict | None) -> str:
    if not connectivity:
        return ""
    parts = [curve_section(c) for c in connectivity.get("curves", [])]
    parts += [f"<p>Curve against v{_e(e['a'])} failed: {_e(e['error'])}</p>" for e in connectivity.get("errors", [])]
    return f'<section id="connectivity"><h2>Mode connectivity</h2>{"".join(parts)}</section>'


def render_connectivity_report(report: dict) -> str:
    ev = report["evidence"]
    rows = {"Versions": f"v{ev['a']} -> v{ev['b']}",
            "Forget set": f"{ev['forget_count']} records, manifest sha256 {ev['forget_manifest_sha256']}",
            "Options": json.dumps(ev["options"], sort_keys=True), "Worker": ev["worker"],
            "Submitted": ev["created_at"], "Started": ev["started_at"], "Report sha256": report.get("sha256", "")}
    return f"""<!doctype html><html lang="en"><head>\
<meta charset="utf-8"><title>Connectivity {_e(report['job_id'])}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:24px auto;color:#222}}
.verdict{{border:2px solid #444;padding:12px 16px;font-size:18px;font-weight:bold}}
table{{border-collapse:collapse;font-size:13px;width:100%}}\
td{{border:1px solid #ddd;padding:4px 8px;word-break:break-all}}</style>
</head><body><h1>Mode connectivity report</h1><div class="verdict" id="verdict">{_e(report['verdict']['summary'])}</div>
{mcu_section(report['connectivity'])}
<section><h2>Evidence</h2><table id="evidence">\
{''.join(f'<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>' for k, v in rows.items())}</table></section>
</body></html>"""
