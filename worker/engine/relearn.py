"""Relearning probe (SPEC section 5): fine-tune a copy for a few steps on half of the forget set and
measure verbatim memorisation on the other half after each budget: how much comes back."""
from __future__ import annotations

import copy
import random

import torch

from worker.engine.extraction import greedy_leaks
from worker.engine.margin import active_positions, token_nll
from worker.engine.metrics import unavailable
from worker.engine.metrics.text import generation_metrics
from worker.engine.records import EncodedRecord, collate


def relearning_probe(model, tokenizer, forget: list[EncodedRecord], references: dict[str, str], *,
                     budgets=(5, 10, 20), lr: float = 1e-5, batch_size: int = 4, seed: int = 0,
                     secrets: dict[str, list[str]] | None = None) -> dict:
    """`secrets`: also the share of measured records whose secrets come back, at each point."""
    if len(forget) < 2:
        return unavailable("needs at least two forget records (half to relearn on, half to measure)")
    order = forget[:]
    random.Random(seed).shuffle(order)
    train, held = order[: len(order) // 2], order[len(order) // 2:]
    clone = copy.deepcopy(model).eval().requires_grad_(True)  # dropout off, as in unlearning
    optimiser = torch.optim.AdamW(clone.parameters(), lr=lr)
    device = next(clone.parameters()).device

    def measure(steps: int) -> dict:
        found = generation_metrics(clone, tokenizer, held, references)
        point = {"steps": steps, "exact_match": found["exact_match"]["value"],
                 "rouge_l_recall": found["rouge_l_recall"]["value"]}
        if secrets is not None:
            leaked = greedy_leaks(found["generated"], secrets)
            point["secret_leak"], point["leaking_ids"] = leaked["value"], leaked.get("leaking_ids", [])
        return point

    points, rng = [measure(0)], random.Random(seed)
    for step in range(1, max(budgets) + 1):
        batch = collate(rng.sample(train, min(batch_size, len(train))), tokenizer.pad_token_id).to(device)
        logits = clone(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        z, y, _ = active_positions(logits, batch.labels)
        loss = token_nll(z, y)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        if step in budgets:
            points.append(measure(step))
    return {"value": points[-1]["rouge_l_recall"], "per_record": {}, "points": points, "lr": lr,
            "relearn_records": len(train), "measured_records": len(held)}
