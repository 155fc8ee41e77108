"""Forget, retain and holdout records (SPEC section 2): reading, checking, tokenising, batching.

A record becomes token ids plus labels: labels[i] is the token at i where it is active (scored),
IGNORE elsewhere. Position t's logits predict labels[t + 1].
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from lethe.engine.contract.chat_format import RENDERED
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.data.documents import TOKENS

IGNORE = -100
# What the forget term does at an active position (Batch.focus): leave it to the fluency term (a token of
# the shared template), suppress it (a record with no located secret: every token), or take it out (a
# token of the record's k-th secret: SECRET + k, so that each secret's probability can be told apart).
TEMPLATE, SUPPRESS, SECRET = 0, 1, 2
# A token of the model's own answer that repeats what the answer already said, in an answer that loops:
# suppressed until it is no longer the argmax (unlikelihood of repetition), never held at theta_0.
LOOP = -1
# A token of a closed record's clean greedy answer, riding along: kept the argmax with a margin (neither suppressed
# nor moved to a target), so that training the others does not flip the answer at a near tie.
HELD = -2
# Continuation mode (SPEC 2): split a passage at r ~ U(0.2, 0.6), keeping this many tokens each side.
SPLIT_RANGE = (0.2, 0.6)
SPLIT_MIN_SIDE = 32


@dataclass
class EncodedRecord:
    id: str
    input_ids: list[int]
    labels: list[int]
    prompt_len: int  # tokens before the first active one (the generation prompt)
    truncated_tokens: int = 0  # prompt tokens dropped from the left to fit the context
    source: dict = field(default_factory=dict, repr=False)
    focus: list[int] | None = None  # per position TEMPLATE, SUPPRESS or SECRET; None: SUPPRESS everywhere
    # Where each active token should go (lethe.engine.methods.masc.destination): per active position the ids [n, K] and
    # probabilities [n, K] of a sparse target distribution; None: no target (the hinge alone, as published).
    target: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    counterfactuals: Any = field(default=None, repr=False)  # held between planning and targets only

    @property
    def active_tokens(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)

    @property
    def secret_tokens(self) -> int:
        return sum(1 for f, t in zip(self.focus or [], self.labels) if f >= SECRET and t != IGNORE)


def encode_record(record: dict, tokenizer, *, max_length: int, seed: int, what: str = "forget") -> EncodedRecord:
    """Token ids and labels of one normalised record (SPEC section 2)."""
    rid = record["id"]
    if "text" in record:
        # A window of a long document (lethe.engine.data.documents) brings its own token ids.
        ids = record[TOKENS] if TOKENS in record else tokenizer(record["text"], add_special_tokens=True)["input_ids"]
        if len(ids) < 2:
            raise EngineInputError(f"{what} record {rid!r}: text has fewer than two tokens")
        prefix = _continuation_split(len(ids), seed, rid)
        context, active = ids[:prefix], ids[prefix:]
    else:
        # A chat-rendered record (lethe.engine.contract.chat_format) holds the template's own BOS and end of turn.
        chat = bool(record.get(RENDERED))
        context = tokenizer(record["prompt"], add_special_tokens=not chat)["input_ids"] if record["prompt"] else []
        active = tokenizer(record["completion"], add_special_tokens=False)["input_ids"] + \
            ([] if chat else [tokenizer.eos_token_id])
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
    focus: torch.Tensor | None = None  # [B, T] TEMPLATE / SUPPRESS / SECRET (None: SUPPRESS)
    # Sparse targets at each label position: ids [B, T, K] and probabilities [B, T, K] (all 0: no target).
    target_ids: torch.Tensor | None = None
    target_probs: torch.Tensor | None = None

    def to(self, device) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return t.to(device) if t is not None else None
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device),
                     move(self.focus), move(self.target_ids), move(self.target_probs))

    def rows(self, start: int, end: int) -> Batch:
        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return t[start:end] if t is not None else None
        return Batch(self.input_ids[start:end], self.attention_mask[start:end], self.labels[start:end],
                     cut(self.focus), cut(self.target_ids), cut(self.target_probs))

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(records: list[EncodedRecord], pad_id: int) -> Batch:
    """Right-padded batch; padding is masked out of attention and labels."""
    width = max(len(r.input_ids) for r in records)
    ids = torch.full((len(records), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(records), width), dtype=torch.long)
    labels = torch.full((len(records), width), IGNORE, dtype=torch.long)
    focus = torch.full((len(records), width), SUPPRESS, dtype=torch.long)
    for row, r in enumerate(records):
        n = len(r.input_ids)
        ids[row, :n] = torch.tensor(r.input_ids)
        mask[row, :n] = 1
        labels[row, :n] = torch.tensor(r.labels)
        if r.focus is not None:
            focus[row, :n] = torch.tensor(r.focus)
    target_ids = target_probs = None
    with_targets = [r for r in records if r.target is not None]
    if with_targets:
        k = max(r.target[0].shape[-1] for r in with_targets)  # type: ignore[index]
        target_ids = torch.zeros((len(records), width, k), dtype=torch.long)
        target_probs = torch.zeros((len(records), width, k))
        for row, r in enumerate(records):
            if r.target is not None:
                got_ids, got_probs = r.target
                target_ids[row, r.prompt_len:len(r.input_ids), :got_ids.shape[-1]] = got_ids
                target_probs[row, r.prompt_len:len(r.input_ids), :got_probs.shape[-1]] = got_probs
    return Batch(ids, mask, labels, focus, target_ids, target_probs)


def concat_batches(first: Batch, second: Batch, pad_id: int) -> Batch:
    """Stack two right-padded batches into one (one forward pass for forget and retain rows)."""
    width = max(first.input_ids.shape[1], second.input_ids.shape[1])

    def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

    focus = None
    if first.focus is not None and second.focus is not None:
        focus = torch.cat([widen(first.focus, SUPPRESS), widen(second.focus, SUPPRESS)])
    target_ids = target_probs = None
    if first.target_ids is not None or second.target_ids is not None:
        k = max(b.target_ids.shape[-1] for b in (first, second) if b.target_ids is not None)
        target_ids = torch.cat([_targets(b.target_ids, len(b), width, k, torch.long, first.input_ids.device)
                                for b in (first, second)])
        target_probs = torch.cat([_targets(b.target_probs, len(b), width, k, torch.float32, first.input_ids.device)
                                  for b in (first, second)])
    return Batch(torch.cat([widen(first.input_ids, pad_id), widen(second.input_ids, pad_id)]),
                 torch.cat([widen(first.attention_mask, 0), widen(second.attention_mask, 0)]),
                 torch.cat([widen(first.labels, IGNORE), widen(second.labels, IGNORE)]), focus, target_ids,
                 target_probs)


def _targets(t: torch.Tensor | None, rows: int, width: int, k: int, dtype, device) -> torch.Tensor:
    """A batch's target tensor widened to [rows, width, k] with zeros (no target where there was none)."""
    out = torch.zeros((rows, width, k), dtype=dtype, device=device)
    if t is not None:
        out[:, :t.shape[1], :t.shape[2]] = t
    return out


def batches(records: list[EncodedRecord], size: int, pad_id: int):
    for start in range(0, len(records), size):
        yield collate(records[start:start + size], pad_id)
