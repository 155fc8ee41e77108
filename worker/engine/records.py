"""Forget, retain and holdout records (SPEC section 2): reading, checking, tokenising, batching.

A record becomes token ids plus labels: labels[i] is the token at i where it is active (scored),
IGNORE elsewhere. Position t's logits predict labels[t + 1].
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from worker.engine.errors import EngineInputError

IGNORE = -100
# Continuation mode (SPEC 2): split a passage at r ~ U(0.2, 0.6), keeping this many tokens each side.
SPLIT_RANGE = (0.2, 0.6)
SPLIT_MIN_SIDE = 32
# TOFU rows map onto our fields (SPEC section 2).
TOFU_FIELDS = {"question": "prompt", "answer": "completion", "paraphrased_question": "paraphrased_prompt",
               "paraphrased_answer": "paraphrased_completion", "perturbed_answers": "perturbed_completions"}


@dataclass
class EncodedRecord:
    id: str
    input_ids: list[int]
    labels: list[int]
    prompt_len: int  # tokens before the first active one (the generation prompt)
    truncated_tokens: int = 0  # prompt tokens dropped from the left to fit the context
    source: dict = field(default_factory=dict, repr=False)

    @property
    def active_tokens(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


def read_records(path: str | Path) -> list[dict]:
    """A JSON list or JSON Lines file of records."""
    path = Path(path)
    if not path.is_file():
        raise EngineInputError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
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


def normalise_records(records, what: str, *, allow_empty: bool = False) -> list[dict]:
    """Check every record and map TOFU rows; errors name the set and the record."""
    if not isinstance(records, list):
        raise EngineInputError(f"{what} set: expected a list of records")
    if not records and not allow_empty:
        raise EngineInputError(f"{what} set is empty")
    out, seen = [], set()
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise EngineInputError(f"{what} record {index}: expected an object")
        record = {TOFU_FIELDS.get(key, key): value for key, value in record.items()}
        rid = str(record.get("id", index))
        name = f"{what} record {index} (id {rid!r})"
        if rid in seen:
            raise EngineInputError(f"{name}: duplicate id")
        seen.add(rid)
        has_pair = "prompt" in record or "completion" in record
        if has_pair and "text" in record:
            raise EngineInputError(f"{name}: has both text and prompt/completion; give one form")
        if has_pair:
            if not isinstance(record.get("prompt"), str) or not isinstance(record.get("completion"), str):
                raise EngineInputError(f"{name}: prompt and completion must both be strings")
            if not record["completion"]:
                raise EngineInputError(f"{name}: empty completion")
        elif "text" in record:
            if not isinstance(record["text"], str) or not record["text"].strip():
                raise EngineInputError(f"{name}: text must be a non-empty string")
        else:
            raise EngineInputError(f"{name}: needs prompt and completion, or text")
        out.append({**record, "id": rid})
    return out


def encode_record(record: dict, tokenizer, *, max_length: int, seed: int, what: str = "forget") -> EncodedRecord:
    """Token ids and labels of one normalised record (SPEC section 2)."""
    rid = record["id"]
    if "text" in record:
        ids = tokenizer(record["text"], add_special_tokens=True)["input_ids"]
        if len(ids) < 2:
            raise EngineInputError(f"{what} record {rid!r}: text has fewer than two tokens")
        prefix = _continuation_split(len(ids), seed, rid)
        context, active = ids[:prefix], ids[prefix:]
    else:
        context = tokenizer(record["prompt"], add_special_tokens=True)["input_ids"] if record["prompt"] else []
        active = tokenizer(record["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if not context:
            # Nothing to condition the first completion token on: it becomes context.
            context, active = active[:1], active[1:]
            if not active:
                raise EngineInputError(f"{what} record {rid!r}: completion too short to score without a prompt")
    # Too long: drop prompt tokens from the left; refuse when the active part alone does not fit.
    dropped = 0
    if max_length and len(context) + len(active) > max_length:
        if len(active) + 1 > max_length:
            raise EngineInputError(
                f"{what} record {rid!r}: {len(active)} completion tokens exceed the model's context "
                f"of {max_length} tokens")
        dropped = len(context) + len(active) - max_length
        context = context[dropped:]
    return EncodedRecord(id=rid, input_ids=context + active, labels=[IGNORE] * len(context) + active,
                         prompt_len=len(context), truncated_tokens=dropped, source=record)


def _continuation_split(n_tokens: int, seed: int, rid: str) -> int:
    """Number of prefix tokens: seeded per record so the split does not depend on set order."""
    if n_tokens < 2 * SPLIT_MIN_SIDE:
        return 1
    ratio = random.Random(f"{seed}:{rid}").uniform(*SPLIT_RANGE)
    return min(max(round(ratio * n_tokens), SPLIT_MIN_SIDE), n_tokens - SPLIT_MIN_SIDE)


def encode_records(records, tokenizer, *, max_length: int, seed: int, what: str) -> list[EncodedRecord]:
    return [encode_record(r, tokenizer, max_length=max_length, seed=seed, what=what) for r in records]


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], IGNORE where inactive or padding

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device))

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(records: list[EncodedRecord], pad_id: int) -> Batch:
    """Right-padded batch; padding is masked out of attention and labels."""
    width = max(len(r.input_ids) for r in records)
    ids = torch.full((len(records), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(records), width), dtype=torch.long)
    labels = torch.full((len(records), width), IGNORE, dtype=torch.long)
    for row, r in enumerate(records):
        n = len(r.input_ids)
        ids[row, :n] = torch.tensor(r.input_ids)
        mask[row, :n] = 1
        labels[row, :n] = torch.tensor(r.labels)
    return Batch(ids, mask, labels)


def concat_batches(first: Batch, second: Batch, pad_id: int) -> Batch:
    """Stack two right-padded batches into one (one forward pass for forget and retain rows)."""
    width = max(first.input_ids.shape[1], second.input_ids.shape[1])

    def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

    return Batch(torch.cat([widen(first.input_ids, pad_id), widen(second.input_ids, pad_id)]),
                 torch.cat([widen(first.attention_mask, 0), widen(second.attention_mask, 0)]),
                 torch.cat([widen(first.labels, IGNORE), widen(second.labels, IGNORE)]))


def batches(records: list[EncodedRecord], size: int, pad_id: int):
    for start in range(0, len(records), size):
        yield collate(records[start:start + size], pad_id)
