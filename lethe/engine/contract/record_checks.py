"""Record sets (SPEC section 2) as JSON: reading and checking, with no torch, so that the API can
refuse a bad request with the very rules the engine applies."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from lethe.engine.contract.errors import EngineInputError

# TOFU rows map onto our fields (SPEC section 2).
TOFU_FIELDS = {"question": "prompt", "answer": "completion", "paraphrased_question": "paraphrased_prompt",
               "paraphrased_answer": "paraphrased_completion", "perturbed_answers": "perturbed_completions"}


LIST_FIELDS = ("perturbed_completions", "perturbed_answers", "secrets")  # a CSV cell holds them as a JSON list
# The erasure request a forget record belongs to, where one run erases several (a coalesced run, issue 28): the stop
# rule holds a record's answers to its own request's records' content, as that request's own run would. Records that
# name none form one request.
REQUEST = "request"


def read_records(path: str | Path) -> list[dict]:
    """A JSON list, JSON Lines, or CSV (by the name's ending: a header row naming the fields) file of records."""
    path = Path(path)
    if not path.is_file():
        raise EngineInputError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        return _csv_records(path, text)
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            records = json.loads(stripped)
        else:
            records = []
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise EngineInputError(f"{path}: line {number} is not JSON ({exc.msg})") from None
    except json.JSONDecodeError as exc:
        raise EngineInputError(f"{path}: not JSON ({exc.msg})") from None
    return records


def _csv_records(path: Path, text: str) -> list[dict]:
    """Rows of a CSV file as records: empty cells left out, list fields parsed from JSON."""
    records = []
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        record: dict = {}
        for key, value in row.items():
            if key is None or value is None or value == "":
                continue  # a row longer than the header, or an empty cell
            if key in LIST_FIELDS:
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    raise EngineInputError(f"{path}: line {number}, column {key}: expected a JSON list") from None
            record[key.strip()] = value
        records.append(record)
    return records


def normalise_records(records, what: str, *, allow_empty: bool = False) -> list[dict]:
    """Check every record and map TOFU rows; errors name the set and the record."""
    if not isinstance(records, list):
        raise EngineInputError(f"{what} set: expected a list of records", field=what)
    if not records and not allow_empty:
        raise EngineInputError(f"{what} set is empty", field=what)
    out, seen = [], set()
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise EngineInputError(f"{what} record {index}: expected an object", field=what)
        record = {TOFU_FIELDS.get(key, key): value for key, value in record.items()}
        rid = str(record.get("id", index))
        name = f"{what} record {index} (id {rid!r})"
        if rid in seen:
            raise EngineInputError(f"{name}: duplicate id", field=what)
        seen.add(rid)
        has_pair = "prompt" in record or "completion" in record
        if has_pair and "text" in record:
            raise EngineInputError(f"{name}: has both text and prompt/completion; give one form", field=what)
        if has_pair:
            if not isinstance(record.get("prompt"), str) or not isinstance(record.get("completion"), str):
                raise EngineInputError(f"{name}: prompt and completion must both be strings", field=what)
            if not record["completion"]:
                raise EngineInputError(f"{name}: empty completion", field=what)
        elif "text" in record:
            if not isinstance(record["text"], str) or not record["text"].strip():
                raise EngineInputError(f"{name}: text must be a non-empty string", field=what)
        else:
            raise EngineInputError(f"{name}: needs prompt and completion, or text", field=what)
        if internal := [k for k in record if isinstance(k, str) and k.startswith("_")]:
            # The engine's own marks (a window's token ids, a chat rendering) never come from a request.
            raise EngineInputError(f"{name}: field {internal[0]!r} is not a record field (names starting with _ are "
                                   "the engine's)", field=what)
        if REQUEST in record and (not isinstance(record[REQUEST], str) or not record[REQUEST]):
            raise EngineInputError(f"{name}: {REQUEST} must be a non-empty string (the erasure request the record "
                                   "belongs to)", field=what)
        secrets = record.get("secrets")
        if secrets is not None and (not isinstance(secrets, list)
                                    or not all(isinstance(x, str) and x.strip() for x in secrets)):
            raise EngineInputError(f"{name}: secrets must be a list of non-empty strings", field=what)
        for key, value in record.items():
            _check_text(name, key, value, what)
        out.append({**record, "id": rid})
    return out


MAX_RECORD_CHARS = 1_000_000  # per string field: about 250k tokens, far past any context


def _check_text(name: str, key: str, value, what: str) -> None:
    """Strings a database and a tokenizer can hold: no NUL, no lone surrogate, not absurdly long."""
    for text in (value if isinstance(value, list) else [value]):
        if not isinstance(text, str):
            continue
        if len(text) > MAX_RECORD_CHARS:
            raise EngineInputError(f"{name}: {key} holds {len(text)} characters, over {MAX_RECORD_CHARS}", field=what)
        if "\x00" in text:
            raise EngineInputError(f"{name}: {key} holds a NUL character", field=what)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise EngineInputError(f"{name}: {key} holds a lone surrogate (not valid Unicode text)",
                                   field=what) from None
