"""Relearning probe (SPEC section 5): fine-tune a copy for a few steps on half of the forget set and measure verbatim
memorisation on the other half after each budget: how much comes back. Twice, the halves swapped, so that every record
is measured after relearning on records other than itself (issue 25: a per-record outcome).

The copy is trained in float32 whatever the checkpoint's dtype: AdamW at lr 1e-5 on bfloat16 weights mostly rounds
away (a 1000x1000 bfloat16 matrix: 15 % of its weights changed after 5 steps), and a probe that trains nothing
reports that nothing came back."""
from __future__ import annotations

import copy
import random

import torch

from lethe.engine.audit.extraction import greedy_leaks
from lethe.engine.audit.metrics import unavailable
from lethe.engine.audit.metrics.text import generation_metrics
from lethe.engine.data.records import EncodedRecord, collate
from lethe.engine.methods.masc.margin import active_positions, token_nll


def relearning_probe(model, tokenizer, forget: list[EncodedRecord], references: dict[str, str], *,
                     budgets=(5, 10, 20), lr: float = 1e-5, batch_size: int = 4, seed: int = 0,
                     secrets: dict[str, list[str]] | None = None) -> dict:
    """Per budget, the measured records' exact match and ROUGE-L recall (mean over both folds) and, with `secrets`,
    the share whose secrets come back; per record, 1 where after the last budget its greedy answer reproduces it or
    says one of its secrets."""
    if len(forget) < 2:
        return unavailable("needs at least two forget records (half to relearn on, half to measure)")
    order = forget[:]
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    folds = [_fold(model, tokenizer, order[:half], order[half:], references, budgets, lr, batch_size, seed, secrets),
             _fold(model, tokenizer, order[half:], order[:half], references, budgets, lr, batch_size, seed + 1,
                   secrets)]
    points = []
    for a, b in zip(*(f["points"] for f in folds)):
        weight = a["records"] / (a["records"] + b["records"])  # each record counts once
        point = {"steps": a["steps"], **{k: weight * a[k] + (1 - weight) * b[k] for k in ("exact_match",
                                                                                          "rouge_l_recall")}}
        if secrets is not None:
            point["leaking_ids"] = sorted(a["leaking_ids"] + b["leaking_ids"])
            with_secrets = a["with_secrets"] + b["with_secrets"]  # over the records that have one, as greedy_leaks
            point["secret_leak"] = len(point["leaking_ids"]) / with_secrets if with_secrets else None
        points.append(point)
    per_record = {**folds[0]["per_record"], **folds[1]["per_record"]}
    return {"value": points[-1]["rouge_l_recall"], "per_record": per_record, "points": points, "lr": lr,
            "dtype": "float32", "folds": 2, "relearn_records": half, "measured_records": len(order)}


def _fold(model, tokenizer, train: list[EncodedRecord], held: list[EncodedRecord], references: dict[str, str],
          budgets, lr: float, batch_size: int, seed: int, secrets: dict[str, list[str]] | None) -> dict:
    """Relearn on `train`, measure `held` at step 0 and after each budget."""
    clone = copy.deepcopy(model).float().eval().requires_grad_(True)  # dropout off, as in unlearning
    optimiser = torch.optim.AdamW(clone.parameters(), lr=lr)
    device = next(clone.parameters()).device
    last: dict = {}

    def measure(steps: int) -> dict:
        found = generation_metrics(clone, tokenizer, held, references)
        point = {"steps": steps, "records": len(held), "exact_match": found["exact_match"]["value"],
                 "rouge_l_recall": found["rouge_l_recall"]["value"]}
        came_back = dict(found["exact_match"]["per_record"])
        if secrets is not None:
            leaked = greedy_leaks(found["generated"], secrets)
            point["secret_leak"], point["leaking_ids"] = leaked["value"], leaked.get("leaking_ids", [])
            point["with_secrets"] = len(leaked.get("per_record") or {})
            for rid, value in (leaked.get("per_record") or {}).items():
                came_back[rid] = max(came_back[rid], value)
        last.update(came_back)
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
    return {"points": points, "per_record": last}
