"""One request's slice of a coalesced run's result and audit (issue 28, lethe.service.domain.runs).

In the run every record's id is its job's id, "/", its own id. A request's slice keeps, wherever the documents
name records (a dict keyed by record id, a list of records with an "id", a list of ids), only its own records, under
their own ids again; the other members' records go. Aggregates (a metric's "value", V, the loss trace) stay the
run's: they were measured over every member's records, and the report says so under "run". The verdict is then
judged on the slice, so each request's verdict rests on its own records."""
from __future__ import annotations

from typing import Any


def member_slice(document: Any, prefix: str, prefixes: list[str]) -> Any:
    """`document` as request `prefix` sees it; `prefixes`: every member's, its own included."""
    def foreign(value: Any) -> bool:
        return isinstance(value, str) and any(value.startswith(p) for p in prefixes) and not value.startswith(prefix)

    def own(value: str) -> str:
        return value[len(prefix):] if value.startswith(prefix) else value

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {own(k) if isinstance(k, str) else k: walk(v) for k, v in value.items() if not foreign(k)}
        if isinstance(value, list):
            return [walk(v) for v in value
                    if not foreign(v) and not (isinstance(v, dict) and foreign(v.get("id")))]
        if isinstance(value, str):
            return own(value)
        return value

    return walk(document)


def run_summary(run_id: str, members: list[dict], records: int) -> dict:
    """What a member's report says of the run it was part of."""
    return {"id": run_id, "requests": members, "forget_records": records,
            "note": "one run and one audit served these requests; aggregate figures (V, metric values, traces) are "
                    "the run's over all their records, per-record figures and the verdict this request's own"}
