"""Long documents (issue 14): a `text` record longer than the model's context becomes windows of it, each a record
of its own for training, for the stop rule and for the audit (non-overlapping, of near-equal length, each with
its own seeded continuation split, SPEC section 2). A window's id is the document's with "#k"; it keeps its token
ids exactly as the document tokenised, so nothing is lost or re-tokenised at a boundary. The result and the
report then say, per document, whether every window meets the erasure condition."""
from __future__ import annotations

import math
from typing import Any

from lethe.engine.contract.errors import EngineInputError

TOKENS = "_tokens"  # a window's own token ids (special tokens included), used as they are by encode_record
DOCUMENT = "_document"  # a window's document id


def _specials(full: list[int], plain: list[int]) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer added before and after a text (BOS, sometimes EOS): `full` is the text
    tokenised with them, `plain` without."""
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return [], []


def split_documents(records: list[dict], tokenizer: Any, max_length: int, what: str) -> list[dict]:
    """Every `text` record longer than `max_length` tokens as its windows; other records as they are."""
    if not max_length:
        return records
    ids = {r["id"] for r in records}
    out: list[dict] = []
    for record in records:
        if "text" not in record or TOKENS in record:
            out.append(record)
            continue
        full = tokenizer(record["text"], add_special_tokens=True)["input_ids"]
        if len(full) <= max_length:
            out.append(record)  # fits
            continue
        body = tokenizer(record["text"], add_special_tokens=False)["input_ids"]
        before, after = _specials(full, body)
        size = max_length - len(before) - len(after)
        if size < 2:
            out.append(record)  # the context cannot hold a window: encode_record says so
            continue
        count = math.ceil(len(body) / size)
        bounds = [round(i * len(body) / count) for i in range(count + 1)]
        for k in range(count):
            window_id = f"{record['id']}#{k + 1}"
            if window_id in ids:
                raise EngineInputError(f"{what} record {record['id']!r}: its window {window_id!r} would take the id "
                                       "of another record; rename one of them", field=what)
            chunk = body[bounds[k]:bounds[k + 1]]
            text = tokenizer.decode(chunk)
            window = {key: value for key, value in record.items() if key not in ("id", "text", "secrets")}
            window.update(id=window_id, text=text, **{DOCUMENT: record["id"], TOKENS: before + chunk + after})
            if record.get("secrets"):  # a secret across a boundary belongs to neither window (the audit sees both)
                window["secrets"] = [s for s in record["secrets"] if s in text]
            out.append(window)
    return out


def document_summary(sources: list[dict], per_record: list[dict] | None) -> list[dict]:
    """Per split document: its windows, whether each meets the erasure condition, and whether all do."""
    windows: dict[str, list[str]] = {}
    for source in sources:
        if DOCUMENT in source:
            windows.setdefault(source[DOCUMENT], []).append(source["id"])
    by_id = {r["id"]: r for r in per_record or []}
    out = []
    for document, ids in windows.items():
        rows = [by_id[i] for i in ids if i in by_id]
        meets = [r["meets_condition"] for r in rows if "meets_condition" in r]
        out.append({"id": document, "windows": ids,
                    "violation": sum(r["violation"] for r in rows) / len(rows) if rows else None,
                    "reproduced_windows": [r["id"] for r in rows if r.get("reproduced")],
                    "meets_condition": all(meets) if meets and len(meets) == len(ids) else None})
    return out
