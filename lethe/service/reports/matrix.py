"""The verdict's per-record matrix on the report page (issue 25): a row per forget record (its id, never its text), a
column per channel, a mark per outcome, so that a person sees at a glance which record leaks where."""
from __future__ import annotations

from lethe.engine.audit.verdict import CHANNELS, CLEAN, FLOOR, LABELS, LEAKS
from lethe.service.reports.charts import escape as _e

MARKS = {CLEAN: ("ok", "#1a7f37", "clean"), FLOOR: ("~", "#9a6700", "within its floor"),
         LEAKS: ("LEAK", "#b42318", "leaks"), "not measured": ("-", "#888", "not measured")}
SHORT = {"rule": "rule", "greedy": "prompt", "paraphrase": "paraphrase", "sampled": "sampled",
         "quantized": "4-bit", "relearned": "relearned", "loops": "loops"}
MAX_ROWS = 500  # a page stays readable; the JSON report carries every row


def _cell(row: dict) -> str:
    text, colour, meaning = MARKS.get(row["outcome"], MARKS["not measured"])
    figure = "" if row.get("figure") is None else f"figure {row['figure']:.2g}, threshold {row['threshold']:.2g}"
    title = _e(f"{LABELS[row['channel']]}: {meaning}" + (f" ({figure})" if figure else "")
               + (f" ({row['reason']})" if row.get("reason") else ""))
    return (f'<td class="cell {row["outcome"].replace(" ", "-")}" data-channel="{row["channel"]}" title="{title}" '
            f'style="color:{colour};text-align:center;font-weight:bold">{text}</td>')


def matrix_section(verdict: dict) -> str:
    rows = verdict.get("records")
    if not rows:
        return ""
    by_record: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_record.setdefault(row["record"], {})[row["channel"]] = row
    ids = list(by_record)
    head = "".join(f'<th title="{_e(LABELS[c])}">{_e(SHORT[c])}</th>' for c in CHANNELS)
    body = "".join(f'<tr data-record="{_e(rid)}"><td>{_e(rid)}</td>'
                   + "".join(_cell(by_record[rid][c]) for c in CHANNELS if c in by_record[rid]) + "</tr>"
                   for rid in ids[:MAX_ROWS])
    more = f"<p>{len(ids) - MAX_ROWS} more records in the JSON report.</p>" if len(ids) > MAX_ROWS else ""
    floors = "".join(f"<li>{_e(LABELS[c])}: floor {_e(source)}</li>"
                     for c, source in (verdict.get("floors") or {}).items())
    legend = ", ".join(f"{text} {meaning}" for text, _, meaning in MARKS.values())
    return (f'<section id="records"><h2>Per record</h2><p>{_e(verdict.get("rule", ""))}</p><p>{_e(legend)}.</p>'
            f'<table id="record-matrix" style="table-layout:auto"><tr><th>record</th>{head}</tr>{body}</table>{more}'
            f"<ul>{floors}</ul></section>")
