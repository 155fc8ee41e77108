"""The stop rule's targets, calibrated per request from the original model's own behaviour on text of
the same shape that it never saw (SPEC section 3, alpha "auto").

For forget record i, the ceiling c_i is theta_0's violation rate on the record's counterfactuals: its
`perturbed_completions` when given, else versions with its distinctive content replaced
(lethe.engine.data.counterfactual). "Erased" then means: no more dominant than the untouched model is on
the same sentence with other facts in it. A record with no counterfactual takes theta_0's V on the
request's holdout (non-member) records, else the median of the other records' ceilings, else
DEFAULT_CEILING; the result says which. alpha "auto" is the mean of the ceilings, the V that a forget
set of unseen text would show.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.data.counterfactual import request_counterfactuals
from lethe.engine.data.records import EncodedRecord, encode_record

AUTO = "auto"
DEFAULT_CEILING = 0.5  # used only when a request offers no text of the same shape at all


@dataclass
class Calibration:
    alpha: float
    ceilings: dict[str, float]
    summary: dict  # for the result: values, where they came from


def counterfactual_records(forget: list[dict], retain: list[dict], seed: int) -> dict[str, list[dict]]:
    """Per forget record, its counterfactuals as records of the same form (prompt kept)."""
    out = {}
    for rid, texts in request_counterfactuals(forget, retain, seed).items():
        record = next(r for r in forget if r["id"] == rid)
        if "text" in record:  # the same id keeps the same seeded continuation split
            out[rid] = [{"id": rid, "text": t} for t in texts]
        else:
            out[rid] = [{"id": f"{rid}#cf{j}", "prompt": record["prompt"], "completion": t}
                        for j, t in enumerate(texts)]
    return out


def calibrate(alpha, record_ceiling, forget: list[dict], retain: list[dict], holdout: list[dict], seed: int,
              violation_of: Callable[[list[dict]], list[float]], floors: dict[str, float] | None = None,
              mean_over: set[str] | None = None) -> Calibration:
    """alpha and the ceilings, each "auto" or a number. `violation_of(records)`: theta_0's v_i on each
    record that can be encoded (the others are left out). `floors`: per record, a value its automatic
    ceiling does not go below (the template's share of its tokens, when its secret is located).
    `mean_over`: the records the rule's mean counts (lethe.engine.methods.masc.stop_rule), when not all of them:
    alpha "auto" is the mean of their ceilings, so that it describes the same records (of all, when
    none is left)."""
    summary: dict = {}
    holdout_v = None
    if holdout:
        values = violation_of(holdout)
        holdout_v = _mean(values) if values else None
        summary["holdout_v"] = holdout_v
    automatic: dict[str, float] = {}
    sources: dict[str, str] = {}
    if AUTO in (alpha, record_ceiling):
        automatic, sources = _per_record(forget, retain, seed, holdout_v, violation_of)
        for rid, floor in (floors or {}).items():
            if floor > automatic[rid]:
                automatic[rid], sources[rid] = floor, "template_share"
    if record_ceiling == AUTO:
        ceilings = automatic
        summary["ceilings"] = {"source": "auto", "by_source": dict(sorted(_count(sources).items())),
                               "min": min(ceilings.values()), "mean": _mean(ceilings.values()),
                               "max": max(ceilings.values())}
    else:
        ceilings = {r["id"]: float(record_ceiling) for r in forget}
        summary["ceilings"] = {"source": "given", "value": float(record_ceiling)}
    if alpha == AUTO:
        counted = [v for rid, v in automatic.items() if mean_over is None or rid in mean_over]
        value = _mean(counted or automatic.values())
        summary["alpha"] = {"value": value, "source": "auto",
                            "basis": "mean over the forget records of theta_0's V on their counterfactuals"}
        if mean_over is not None and len(counted) < len(automatic):
            summary["alpha"]["basis"] += (f" ({len(counted)} of {len(automatic)}: "
                                          "those without a located secret)" if counted else
                                          " (every record has a located secret: its secret conditions decide, not "
                                          "the mean)")
    else:
        value = float(alpha)
        summary["alpha"] = {"value": value, "source": "given"}
    # A calibrated 0 (theta_0 dominates no token of unseen text) asks for every token suppressed: reachable.
    return Calibration(alpha=value, ceilings=ceilings, summary=summary)


def _per_record(forget, retain, seed, holdout_v, violation_of) -> tuple[dict[str, float], dict[str, str]]:
    ceilings: dict[str, float] = {}
    sources: dict[str, str] = {}
    for rid, records in counterfactual_records(forget, retain, seed).items():
        values = violation_of(records) if records else []
        if values:
            ceilings[rid] = sum(values) / len(values)
            given = bool(next(r for r in forget if r["id"] == rid).get("perturbed_completions"))
            sources[rid] = "perturbed_completions" if given else "generated_counterfactuals"
    missing = [r["id"] for r in forget if r["id"] not in ceilings]
    if missing:
        if holdout_v is not None:
            fill, source = holdout_v, "holdout"
        elif ceilings:
            fill, source = statistics.median(ceilings.values()), "median_of_other_records"
        else:
            fill, source = DEFAULT_CEILING, "default"
        for rid in missing:
            ceilings[rid], sources[rid] = fill, source
    return {r["id"]: ceilings[r["id"]] for r in forget}, sources


def _count(sources: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for source in sources.values():
        out[source] = out.get(source, 0) + 1
    return out


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def encodable(records: list[dict], tokenizer: Any, max_length: int, seed: int) -> list[EncodedRecord]:
    """Checked records that fit the model's context (a counterfactual or holdout record that does not is
    skipped). A passage's counterfactual keeps its record's id, and so its seeded continuation split."""
    out = []
    for record in records:
        try:
            out.append(encode_record(record, tokenizer, max_length=max_length, seed=seed, what="calibration"))
        except EngineInputError:
            continue
    return out
