"""How close the utility set's answers are to flipping: for each record, the smallest margin (the gold token's logit
minus the best other token's) over its answer tokens, teacher-forced. A run can leave every greedy answer unchanged
(utility hardly moves) while it wears these margins down; the next run then flips many at once. On the sequential
fixture one run took the median from 5.25 logits to about 3, two chained runs to about 1.1 (11 of 57 below 0), so
this tells after one request what utility shows only after two or three."""
from __future__ import annotations

import statistics

import torch

from lethe.engine.data.records import EncodedRecord, batches
from lethe.engine.methods.masc.margin import active_positions


@torch.no_grad()
def weakest_margins(model, records: list[EncodedRecord], pad_id: int, batch_size: int = 16) -> list[float]:
    """Each record's smallest gold-minus-best-other logit margin over its active (answer) tokens, in order."""
    device = next(model.parameters()).device
    out: list[float] = []
    for batch in batches(records, batch_size, pad_id):
        batch = batch.to(device)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits.float()
        z, y, rows = active_positions(logits, batch.labels)
        gold = z.gather(1, y[:, None]).squeeze(1)
        other = z.scatter(1, y[:, None], float("-inf")).max(1).values
        weakest = torch.full((len(batch),), float("inf"), device=device)
        weakest = weakest.scatter_reduce(0, rows, gold - other, reduce="amin")
        out += weakest.tolist()
    return out


def margin_summary(margins: list[float]) -> dict:
    """The median weakest margin, and how many records are below 0 (greedy already says something else at some
    token) and below 2 logits (one more run away from it)."""
    return {"median": round(statistics.median(margins), 2), "below_0": sum(m < 0 for m in margins),
            "below_2": sum(m < 2 for m in margins), "of": len(margins)}
