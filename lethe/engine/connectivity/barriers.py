"""Barrier heights along a curve and the suppress-first analysis (SPEC section 6)."""
from __future__ import annotations


def chord(rows: list[dict], key: str) -> list[float]:
    """The linear interpolation of the endpoint values, (1 - t) L(theta_1) + t L(theta_2), at each row's t."""
    first, last = rows[0][key], rows[-1][key]
    return [(1 - r["t"]) * first + r["t"] * last for r in rows]


def barrier(rows: list[dict], key: str, sign: int) -> dict:
    """max_t sign * (L(phi(t)) - interpolation): sign +1 for retain (a hill), -1 for forget (a valley)."""
    if not rows or any(key not in r for r in rows):
        return {"value": None, "t": None, "reason": f"{key} was not measured"}
    gaps = [sign * (r[key] - line) for r, line in zip(rows, chord(rows, key))]
    i = max(range(len(gaps)), key=gaps.__getitem__)
    return {"value": gaps[i], "t": rows[i]["t"], "per_point": gaps}


def barriers(rows: list[dict], tolerance: float) -> dict:
    """B_r (retain loss above the line) and B_f (forget loss below it: forgotten text coming back)."""
    b_r, b_f = barrier(rows, "retain_nll", +1), barrier(rows, "forget_nll", -1)
    values = [b["value"] for b in (b_r, b_f)]
    holds = None if None in values else all(v <= tolerance for v in values)
    out = {"retain": b_r, "forget": b_f, "tolerance": tolerance, "mcu_holds": holds}
    if holds is None:
        out["reason"] = "MCU is judged on both barriers; " + "; ".join(b["reason"] for b in (b_r, b_f) if "reason" in b)
    return out


def crossing(rows: list[dict], key: str, fraction: float, min_drop: float) -> dict:
    """The first t at which `key` has made `fraction` of its drop from t = 0 to t = 1, by linear
    interpolation between the measured points; None with a reason when it does not fall."""
    if not rows or any(r.get(key) is None for r in rows):
        return {"t": None, "reason": f"{key} was not measured"}
    start, end = rows[0][key], rows[-1][key]
    if start - end < min_drop:
        return {"t": None, "start": start, "end": end,
                "reason": f"did not fall ({start:.3f} -> {end:.3f}, less than {min_drop})"}
    threshold = end + (1 - fraction) * (start - end)
    # Every value before the first one at or below the threshold lies above it; the end lies at or below.
    for before, after in zip(rows, rows[1:]):
        if after[key] <= threshold:
            share = (before[key] - threshold) / (before[key] - after[key])
            return {"t": before["t"] + share * (after["t"] - before["t"]), "threshold": threshold,
                    "start": start, "end": end}
    raise AssertionError("unreachable: the end lies at or below the threshold")


def suppress_first(rows: list[dict], fraction: float, min_drop: float) -> dict:
    """Along parent -> new version: where verbatim memorisation falls, where knowledge does, which first."""
    verbatim = crossing(rows, "rouge_l", fraction, min_drop)
    knowledge = crossing(rows, "knowledge_rouge_l", fraction, min_drop)
    out = {"fraction": fraction, "verbatim": verbatim, "knowledge": knowledge}
    if verbatim["t"] is None or knowledge["t"] is None:
        out["first"] = None
    elif abs(verbatim["t"] - knowledge["t"]) < 1e-9:
        out["first"] = "together"
    else:
        out["first"] = "verbatim" if verbatim["t"] < knowledge["t"] else "knowledge"
    return out
