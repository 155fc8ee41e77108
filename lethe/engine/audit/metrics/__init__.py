"""Audit metrics (SPEC section 5). Every metric has one shape: {"value": aggregate or None,
"per_record": {id: value}}, plus "reason" when the value is None."""
from __future__ import annotations


def metric(per_record: dict, value: float | None = None) -> dict:
    """The aggregate defaults to the mean of the per-record values."""
    if value is None and per_record:
        value = sum(per_record.values()) / len(per_record)
    return {"value": value, "per_record": per_record}


def metric_value(section: dict | None, *path: str):
    """The figure at `path` in a result or report section: a metric's "value" (metrics have one shape), a plain
    number as it is, None where the path or the value is missing."""
    for key in path:
        section = section.get(key) if isinstance(section, dict) else None
    return section.get("value") if isinstance(section, dict) else section


def unavailable(reason: str) -> dict:
    return {"value": None, "per_record": {}, "reason": reason}


def harmonic_mean(values: list[float]) -> float:
    if any(v <= 0 for v in values):
        return 0.0
    return len(values) / sum(1 / v for v in values)

