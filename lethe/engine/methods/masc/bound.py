"""Proposition 1 (SPEC section 3): at a non-violating position p(y_t | c_t) <= rho when beta = 1, so
a sequence with L active tokens and violation fraction v is reproduced exactly with probability
<= rho^((1 - v) L)."""
from __future__ import annotations

import math


def exact_reproduction_bound(rho: float, beta: float, records: list[dict]) -> dict:
    """records: [{"id", "violation", "active_tokens"}]. Per-record bounds and their aggregate."""
    per_record = []
    for r in records:
        suppressed = round((1 - r["violation"]) * r["active_tokens"])  # v * L is a whole count
        log10_bound = suppressed * math.log10(rho)
        per_record.append({**r, "suppressed_tokens": suppressed, "log10_bound": log10_bound,
                           "bound": 10 ** log10_bound})
    bounds = [r["bound"] for r in per_record]
    aggregate = {
        "records": len(per_record),
        "max_bound": max(bounds) if bounds else None,  # the least protected record
        "mean_bound": sum(bounds) / len(bounds) if bounds else None,
        # P(any record reproduced exactly) <= sum of the bounds (union bound).
        "any_record_bound": min(1.0, sum(bounds)) if bounds else None,
        "guaranteed": beta == 1.0,
    }
    if beta != 1.0:
        aggregate["note"] = (f"beta={beta}: the margin is taken at temperature 1/beta, so m <= tau no longer "
                             "implies p(y|c) <= rho; these bounds are not guaranteed")
    return {"per_record": per_record, "aggregate": aggregate}
