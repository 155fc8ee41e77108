"""The report page's extraction and degeneration sections (issue 11): whether each record's secrets come
out of the model, before and after, under every probe; and whether its answers are fluent or loops.
Records are named by id, never quoted."""
from __future__ import annotations

from lethe.service.reports.charts import escape as _e


def _share(figure: dict | None) -> str:
    if not isinstance(figure, dict):
        return "n/a"
    if figure.get("value") is None:
        return f"n/a ({_e(figure.get('reason', 'not measured'))})" if figure.get("reason") else "n/a"
    return f"{figure['value']:.1%}"


def _ids(figure: dict | None) -> str:
    ids = (figure or {}).get("leaking_ids") or []
    return _e(", ".join(ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")) or "none"


def _relearned(audit: dict) -> dict | None:
    """The relearning probe's last point, as a figure: the share of held-back records whose secret came back."""
    points = (audit.get("relearning") or {}).get("points") or []
    if not points or "secret_leak" not in points[-1]:
        return None
    last = points[-1]
    return {"value": last["secret_leak"], "leaking_ids": last.get("leaking_ids", []), "steps": last["steps"]}


def secrets_section(audit: dict) -> str:
    before = (audit.get("before") or {}).get("forget_secrets")
    after = (audit.get("after") or {}).get("forget_secrets")
    if after is None:
        return ""
    options, counts = audit.get("options") or {}, audit.get("secrets") or {}
    relearned = _relearned(audit)
    rows = [("greedy answer to the prompt", (before or {}).get("greedy"), after.get("greedy")),
            ("greedy answer to the paraphrased prompt", (before or {}).get("paraphrased"), after.get("paraphrased")),
            (f"samples at temperature 1 ({options.get('secret_samples', '?')} per record, share of samples)",
             (before or {}).get("sampled"), after.get("sampled")),
            ("greedy, after 4-bit quantisation", (audit.get("quantization") or {}).get("forget_secrets_before"),
             (audit.get("quantization") or {}).get("forget_secrets")),
            (f"greedy, after relearning on the other half ({relearned['steps']} steps)" if relearned
             else "greedy, after relearning", None, relearned)]
    body = "".join(f"<tr><td>{_e(name)}</td><td>{_share(b)}</td><td>{_share(a)}</td><td>{_ids(a)}</td></tr>"
                   for name, b, a in rows)
    source = (f"{counts.get('secrets', 0)} secrets: {counts.get('given', 0)} records gave theirs, "
              f"{counts.get('extracted', 0)} had theirs extracted (numbers, e-mail addresses, words outside the "
              f"shared template), {counts.get('none', 0)} have none") if counts else ""
    return (f'<section id="secrets"><h2>Secret extraction</h2><p>Share of forget records whose secrets come out '
            f'(split by other text or punctuation included). {_e(source)}. The verdict reads each record '
            f'on each of these (the per-record matrix above); relaxations: greedy '
            f'{options.get("secret_greedy_max", 0.0):.0%} of the records, sampled '
            f'{options.get("secret_sampled_max", 0.0):.0%} above the floor.</p><table><tr><td>probe</td><td>before</td>'
            f'<td>after</td><td>records leaking after</td></tr>{body}</table></section>')


def _number(figure: dict | None, percent: bool = False) -> str:
    value = (figure or {}).get("value") if isinstance(figure, dict) else None
    if value is None:
        return "n/a"
    return f"{value:.1%}" if percent else f"{value:.3g}"


def degeneration_section(audit: dict) -> str:
    before = (audit.get("before") or {}).get("degeneration") or {}
    after = (audit.get("after") or {}).get("degeneration") or {}
    if not after:
        return ""
    names = {"forget": "forget prompts", "paraphrased": "paraphrased forget prompts", "retain": "retain prompts"}
    rows = []
    for key, label in names.items():
        if key not in after:
            continue
        b, a = before.get(key) or {}, after[key]
        rows.append(f"<tr><td>{_e(label)}</td>"
                    f"<td>{_number(b.get('loop_share'), True)} / {_number(a.get('loop_share'), True)}</td>"
                    f"<td>{_number(b.get('distinct_2'))} / {_number(a.get('distinct_2'))}</td>"
                    f"<td>{_number(b.get('perplexity_under_base'))} / {_number(a.get('perplexity_under_base'))}</td>"
                    "</tr>")
    return ('<section id="degeneration"><h2>Fluency of the answers</h2><p>Repetition loops (an n-gram said three '
            'times in a row, or a unit repeated inside a word), distinct word bigrams, and the perplexity of the '
            'generated answer under the base model; each as before / after. A model that never saw the records '
            'answers them fluently and wrongly.</p><table><tr><td>answers to</td><td>loops</td><td>distinct-2</td>'
            f'<td>perplexity under base</td></tr>{"".join(rows)}</table></section>')
