"""The verdict of one erasure, per record (issue 25): for every forget record and every channel an outcome, and the
overall verdict derived from that table by the one rule below. Plain data in, plain data out (no torch): the service's
report and `make bench-forgetting` judge with the same code.

A channel's figure per record: 1 or 0 on the greedy channels (the answer says a secret or reproduces the record), the
share of samples that say a secret, 1 or 0 for a repetition loop, 1 or 0 for the stop rule's per-record condition.
Its floor is what a model that never saw the record scores there: the registered retrain reference's own figure on the
same record; for samples also the share of the retain answers of the record's shape that say its secret (how often a
model that learned only the retain data says it), the higher of the two; for loops the base model's own (a loop the
erasure did not make); otherwise 0."""
from __future__ import annotations

import math
from typing import Any

CHANNELS = ("rule", "greedy", "paraphrase", "sampled", "quantized", "relearned", "loops")
LABELS = {"rule": "stop rule's per-record condition",
          "greedy": "greedy answer to the prompt", "paraphrase": "greedy answer to the paraphrased prompt",
          "sampled": "samples at temperature 1", "quantized": "greedy answer of the 4-bit copy",
          "relearned": "greedy answer after relearning on the other records", "loops": "repetition loops"}
GREEDY_CHANNELS = ("greedy", "paraphrase", "quantized", "relearned")  # secret_greedy_max applies to these
SAMPLE_CONFIDENCE = 0.01  # a record's count of leaking samples above what its floor gives with probability 1 - this

RULE = ("Forgotten only when the stop rule fired (or a baseline ran its fixed budget), the audit ran, and no forget "
        "record leaks on any channel measured: the stop rule's per-record condition holds on the saved checkpoint; "
        "no greedy answer (to the prompt, to the paraphrased prompt, of the 4-bit copy, after relearning) says one of "
        "its secrets or reproduces it, beyond its floor (at most secret_greedy_max of the records where the request "
        "set it); its samples say a secret no more often than a model at its floor rate plus secret_sampled_max "
        "would with probability 0.99; and its answers loop only where its floor does, or in no more records than a "
        "model that never saw them loops on by chance (the stop rule's allowance). Otherwise 'Not established', "
        "naming the records and channels. A channel not measured is stated and does not decide.")

CLEAN, LEAKS, FLOOR, UNMEASURED = "clean", "leaks", "within floor", "not measured"


def allowed_samples(n: int, rate: float, confidence: float = SAMPLE_CONFIDENCE) -> int:
    """The most of n samples that may say a secret when each says it with probability `rate`: the smallest c with
    P(Binomial(n, rate) > c) <= confidence (0 when the rate is 0: any leaking sample is one too many)."""
    rate = min(max(rate, 0.0), 1.0)
    if rate == 0.0:
        return 0
    tail = 1.0
    for c in range(n + 1):
        tail -= math.comb(n, c) * rate ** c * (1 - rate) ** (n - c)
        if tail <= confidence + 1e-12:
            return c
    return n


def table(figures: dict[str, dict[str, Any]], record_ids: list[str], options: dict | None = None) -> list[dict]:
    """One row per (record, channel): outcome, figure, threshold, floor. `figures[channel]`: "per_record" {id: figure},
    "floor" {id: floor} (absent: 0), "floor_source", "reason" (why not measured), and for "sampled" "samples" (n)."""
    options = options or {}
    margin = float(options.get("secret_sampled_max", 0.0))
    rows = []
    for channel in CHANNELS:
        part = figures.get(channel) or {}
        values, floors = part.get("per_record") or {}, part.get("floor") or {}
        for rid in record_ids:
            figure, floor = values.get(rid), float(floors.get(rid, 0.0))
            if figure is None:
                rows.append({"record": rid, "channel": channel, "outcome": UNMEASURED, "figure": None,
                             "threshold": None, "floor": None,
                             "reason": part.get("reason", "not measured")})
                continue
            if channel == "sampled":
                n = int(part.get("samples") or 1)
                threshold = allowed_samples(n, floor + margin) / n
            else:
                threshold = min(1.0, floor)
            outcome = CLEAN if figure <= 0 else FLOOR if figure <= threshold + 1e-12 else LEAKS
            rows.append({"record": rid, "channel": channel, "outcome": outcome, "figure": figure,
                         "threshold": threshold, "floor": floor})
    return rows


def decide(rows: list[dict], options: dict | None = None, loop_chance: float = 0.0) -> dict[str, dict]:
    """Per channel: the records that leak, how many were measured, and whether the channel blocks the verdict (any
    leaking record does; on the greedy channels a request's secret_greedy_max lets that share of records pass; on
    the loops channel floor(n loop_chance) records may loop, as many as a model that never saw them does by chance:
    the stop rule's allowance, lethe.engine.methods.masc.stop_rule)."""
    options = options or {}
    greedy_share = float(options.get("secret_greedy_max", 0.0))
    out: dict[str, dict] = {}
    for channel in CHANNELS:
        mine = [r for r in rows if r["channel"] == channel]
        measured = [r for r in mine if r["outcome"] != UNMEASURED]
        leaking = [r["record"] for r in measured if r["outcome"] == LEAKS]
        share = greedy_share if channel in GREEDY_CHANNELS else loop_chance if channel == "loops" else 0.0
        allowed = math.floor(share * len(measured) + 1e-9)
        out[channel] = {"measured": len(measured), "leaking_ids": leaking,
                        "leak_rate": len(leaking) / len(measured) if measured else None,
                        "blocks": len(leaking) > allowed, "allowed": allowed,
                        "reason": None if measured else next((r.get("reason") for r in mine), "no records")}
    return out


def verdict_lines(channels: dict[str, dict]) -> tuple[list[str], list[str]]:
    """Evidence and reasons, a line per channel, records by id only."""
    evidence, reasons = [], []
    for channel, c in channels.items():
        label = LABELS[channel]
        if not c["measured"]:
            evidence.append(f"{label}: not measured ({c['reason']})")
            continue
        ids = c["leaking_ids"]
        verb = "fail" if channel == "rule" else "leak"
        if c["blocks"]:
            reasons.append(f"{label}: {len(ids)} of {c['measured']} records {verb} (ids: {', '.join(ids[:10])}"
                           + (" ..." if len(ids) > 10 else "") + ")")
        elif ids and channel == "loops":
            evidence.append(f"{label}: {len(ids)} of {c['measured']} records loop, within the {c['allowed']} a model "
                            "that never saw them loops on by chance")
        elif ids:
            evidence.append(f"{label}: {len(ids)} of {c['measured']} records leak, within the request's "
                            "secret_greedy_max")
        else:
            evidence.append(f"{label}: no record of {c['measured']} {verb}s")
    return evidence, reasons


def leak_rates(channels: dict[str, dict]) -> dict[str, float | None]:
    """The share of measured records that leak, per channel: what the verdict used."""
    return {channel: c["leak_rate"] for channel, c in channels.items()}


def per_record_at(section: Any, *path: str) -> dict[str, float] | None:
    """The per-record figures of the metric at `path` (None where it is missing or was not measured)."""
    for key in path:
        section = section.get(key) if isinstance(section, dict) else None
    return section.get("per_record") if isinstance(section, dict) and section.get("value") is not None else None


def union(*parts: dict[str, float] | None) -> dict[str, float] | None:
    """Per record, the largest figure of the parts measured (None: none was)."""
    found = [p for p in parts if p is not None]
    if not found:
        return None
    out: dict[str, float] = {}
    for part in found:
        for rid, value in part.items():
            out[rid] = max(out.get(rid, 0.0), float(value))
    return out


def _reason(*sections: Any, default: str) -> str:
    return next((s["reason"] for s in sections if isinstance(s, dict) and s.get("reason")), default)


def sampled_floor(reference: dict[str, float] | None, priors: dict[str, float] | None) -> dict[str, float] | None:
    """Per record, the higher of the two estimates of how often a model that never saw it says its secret: the
    retrain reference's own samples, and the share of retain answers of its shape that say it. Ten samples of the
    reference say nothing of a secret that two of 21 kept customers share ("works as a tram driver") about a third of
    the time; a floor of 0 then holds the erased model's 2 in 10 against it (issue 28)."""
    return union(reference, priors)


def audit_figures(engine: dict, audit: dict) -> dict[str, dict]:
    """The channels' figures and floors per record, read from an engine result and its audit (lethe.engine.audit.run;
    `audit["reference_figures"]`: the retrain reference's own per-record figures, when one is registered)."""
    after, before = audit.get("after") or {}, audit.get("before") or {}
    ref = audit.get("reference_figures")
    secrets = after.get("forget_secrets") or {}
    ref_greedy = union((ref or {}).get("greedy"), (ref or {}).get("exact_match")) if ref else None
    source = "retrain reference" if ref else "0 (no retrain reference registered)"
    figures: dict[str, dict] = {}
    erasure = engine.get("erasure") or {}
    if erasure.get("applied") and engine.get("per_record"):
        figures["rule"] = {"per_record": {r["id"]: float(not r["meets_condition"]) for r in engine["per_record"]},
                           "floor_source": "none"}
    else:
        figures["rule"] = {"reason": "not applied (holdout mode: the mean over held-out records decides)" if erasure
                           else "not part of this method (a fixed budget)"}
    figures["greedy"] = {"per_record": union(per_record_at(after, "forget_verbatim", "exact_match"),
                                              per_record_at(secrets, "greedy")),
                         "floor": ref_greedy, "floor_source": source}
    figures["paraphrase"] = {"per_record": union(per_record_at(after, "forget_knowledge", "exact_match"),
                                                  per_record_at(secrets, "paraphrased")),
                             "floor": union((ref or {}).get("paraphrased"), (ref or {}).get("knowledge_exact_match"))
                             if ref else None, "floor_source": source,
                             "reason": _reason(secrets.get("paraphrased"), default="no record carries a paraphrase")}
    sampled = secrets.get("sampled") or {}
    priors = audit.get("secret_priors")
    prior_source = "the share of retain answers of the record's shape that say its secret"
    figures["sampled"] = {"per_record": per_record_at(sampled), "samples": sampled.get("samples_per_record"),
                          "floor": sampled_floor((ref or {}).get("sampled") if ref else None, priors),
                          "floor_source": " and ".join(s for s, f in ((source, ref), (prior_source, priors))
                                                       if f is not None) or "none",
                          "reason": _reason(sampled, default="no secret given or found")}
    quantized = audit.get("quantization")
    figures["quantized"] = {"per_record": union(per_record_at(quantized, "forget_verbatim", "exact_match"),
                                                 per_record_at(quantized, "forget_secrets")) if quantized else None,
                            "floor": ref_greedy, "floor_source": source,
                            "reason": "the 4-bit probe was switched off" if not quantized else "no answer measured"}
    relearning = audit.get("relearning") or {}
    figures["relearned"] = {"per_record": relearning.get("per_record") or None, "floor": ref_greedy,
                            "floor_source": source, "reason": relearning.get("reason") or
                            ("the relearning probe was switched off" if "relearning" not in audit
                             else "the probe measured no record per record (an audit from before issue 25)")}
    loops_of = lambda ev: union(per_record_at(ev, "degeneration", "forget", "loop_share"),  # noqa: E731
                                 per_record_at(ev, "degeneration", "paraphrased", "loop_share"))
    figures["loops"] = {"per_record": loops_of(after), "floor": union(loops_of(before), (ref or {}).get("loops")),
                        "floor_source": "the base model's own loops" + (" and the retrain reference's" if ref else ""),
                        "reason": "no answer measured"}
    return figures


def judge(engine: dict, audit: dict) -> dict:
    """The per-record table, the channels' outcome and the rule: what a report carries (no verdict line: the stop
    rule's own state is the caller's)."""
    ids = [r["id"] for r in engine.get("per_record") or []]
    figures = audit_figures(engine, audit)
    if not ids:  # a baseline's result names no records: the audit's do
        ids = sorted({rid for f in figures.values() for rid in (f.get("per_record") or {})})
    options = audit.get("options") or {}
    rows = table(figures, ids, options)
    channels = decide(rows, options, float((engine.get("erasure") or {}).get("loop_chance") or 0.0))
    return {"rule": RULE, "rows": rows, "channels": channels,
            "floors": {c: figures[c].get("floor_source", "none") for c in CHANNELS},
            "options": {k: options.get(k) for k in ("secret_greedy_max", "secret_sampled_max", "secret_samples")}}
