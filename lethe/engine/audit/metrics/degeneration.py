"""Degeneration of generated answers (SPEC section 5): repetition loops, distinct-2, and the perplexity
of an answer under the base model. An erased record should be answered fluently and wrongly, as a
model that never saw it would, not with "Mona Mona Mona"."""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

from lethe.engine.audit.metrics import metric, unavailable
from lethe.engine.data.records import IGNORE, Batch
from lethe.engine.model.loading import autocast

TOKEN = re.compile(r"\w+|[^\w\s]")
LOOP_REPEATS = 3  # an n-gram said this many times in a row is a loop, however long (a clause said thrice too)
# Loops inside a word or number ("0202020202", "aaaaaaaa"): a 2-8 character unit 4 times, one character 8.
CHAR_LOOP = re.compile(r"(\S{2,8}?)\1{3,}|(\S)\2{7,}")


def words(text: str) -> list[str]:
    return TOKEN.findall(text.casefold())


def is_loop(text: str) -> bool:
    """Some n-gram of words (any n) repeated at least 3 times back to back, or a unit of characters
    repeated inside one word (CHAR_LOOP)."""
    if CHAR_LOOP.search(text):
        return True
    w = words(text)
    for n in range(1, len(w) // LOOP_REPEATS + 1):
        for start in range(0, len(w) - n * LOOP_REPEATS + 1):
            gram = w[start:start + n]
            if all(w[start + k * n:start + (k + 1) * n] == gram for k in range(1, LOOP_REPEATS)):
                return True
    return False


def repeated_positions(tokens: list[int], n: int = 3) -> list[bool]:
    """Per token: whether it lies inside an n-gram of tokens that the sequence already said earlier (the
    first token of a repetition included: that is where the answer turns back)."""
    seen: set[tuple[int, ...]] = set()
    marked = [False] * len(tokens)
    for start in range(len(tokens) - n + 1):
        gram = tuple(tokens[start:start + n])
        if gram in seen:
            marked[start:start + n] = [True] * n
        seen.add(gram)
    return marked


def distinct_2(text: str) -> float | None:
    """Distinct word bigrams over all bigrams of one answer; None for answers of fewer than 2 words."""
    w = words(text)
    bigrams = list(zip(w, w[1:]))
    return len(set(bigrams)) / len(bigrams) if bigrams else None


def degeneration(texts: dict[str, str]) -> dict:
    """Loop share and mean distinct-2 of a set of answers, per record too."""
    loops = {rid: float(is_loop(t)) for rid, t in texts.items()}
    d2 = {rid: v for rid, t in texts.items() if (v := distinct_2(t)) is not None}
    return {"loop_share": metric(loops), "distinct_2": metric(d2) if d2 else unavailable("no answer of 2 words")}


@torch.no_grad()
def answer_perplexity(model, prompts: dict[str, list[int]], answers: dict[str, list[int]], pad_id: int,
                      batch_size: int = 16) -> dict:
    """exp(mean NLL) of each generated answer (its tokens after the prompt) under `model`."""
    device = next(model.parameters()).device
    ids = [rid for rid in answers if answers[rid]]
    if not ids:
        return unavailable("no answer has any token")
    out = {}
    for start in range(0, len(ids), batch_size):
        chunk = ids[start:start + batch_size]
        rows = [prompts[rid] + answers[rid] for rid in chunk]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, rid in enumerate(chunk):
            n, p = len(rows[i]), len(prompts[rid])
            input_ids[i, :n] = torch.tensor(rows[i])
            mask[i, :n] = 1
            labels[i, p:n] = torch.tensor(answers[rid])
        batch = Batch(input_ids, mask, labels).to(device)
        with autocast(device):
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), batch.labels[:, 1:], ignore_index=IGNORE,
                              reduction="none").sum(1)
        counts = (batch.labels[:, 1:] != IGNORE).sum(1)
        for rid, total, count in zip(chunk, nll.tolist(), counts.tolist()):
            out[rid] = math.exp(total / count)
    return metric(out)
