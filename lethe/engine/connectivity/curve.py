"""Measurements at points along a path (SPEC section 6): retain and forget NLL, violation rate V and
verbatim ROUGE-L, plus knowledge ROUGE-L (paraphrased prompts) where the suppress-first analysis asks."""
from __future__ import annotations

import time

import torch

from lethe.engine.audit.metrics.text import generation_metrics
from lethe.engine.connectivity.paths import Path, load_weights
from lethe.engine.data.records import EncodedRecord, batches
from lethe.engine.methods.masc import margin as M
from lethe.engine.model.loading import autocast


@torch.no_grad()
def loss_and_violation(model, records: list[EncodedRecord], pad: int, params, *, violation: bool) -> dict:
    """Token-mean answer NLL over the set and, when asked, V = mean over records of the violation fraction."""
    device = next(model.parameters()).device
    tau = M.tau(params.rho)
    nll_sum, tokens, per_record_v = 0.0, 0, []
    for batch in batches(records, params.eval_batch_size, pad):
        batch = batch.to(device)
        with autocast(device):
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        z, y, rows = M.active_positions(logits, batch.labels)
        nll_sum += torch.nn.functional.cross_entropy(z.float(), y, reduction="sum").item()
        tokens += len(y)
        if violation:
            margins = M.restricted_margin(z, y, M.self_alternatives(z, y, params.k), None, params.beta)
            per_record_v += M.sequence_violation(margins, rows, len(batch), tau).tolist()
    out = {"nll": nll_sum / max(tokens, 1)}
    if violation:
        out["violation_rate"] = sum(per_record_v) / len(per_record_v)
    return out


def evaluate_path(model, tokenizer, path: Path, ts: list[float], params, *, forget=None, retain=None,
                  knowledge: bool = False, should_cancel=None, progress=None) -> list[dict]:
    """One row per t. `forget` is an audit EvaluationSet (or None), `retain` a list of encoded records.
    The model is left holding the start's weights."""
    pad = tokenizer.pad_token_id
    rows = []
    try:
        for i, t in enumerate(ts):
            if should_cancel is not None and should_cancel():
                raise InterruptedError("cancelled")
            started = time.perf_counter()
            load_weights(model, path.weights(t))
            row: dict = {"t": round(t, 6)}
            if retain:
                row["retain_nll"] = loss_and_violation(model, retain, pad, params, violation=False)["nll"]
            if forget is not None:
                measured = loss_and_violation(model, forget.main, pad, params, violation=True)
                row["forget_nll"], row["violation_rate"] = measured["nll"], measured["violation_rate"]
                row["rouge_l"] = generation_metrics(model, tokenizer, forget.main, forget.references,
                                                    batch_size=params.eval_batch_size)["rouge_l_recall"]["value"]
                if knowledge and forget.paraphrased:
                    refs = {r.id: forget.references[r.id] for r in forget.paraphrased}
                    row["knowledge_rouge_l"] = generation_metrics(
                        model, tokenizer, forget.paraphrased, refs, batch_size=params.eval_batch_size
                    )["rouge_l_recall"]["value"]
            row["seconds"] = round(time.perf_counter() - started, 3)
            rows.append(row)
            if progress is not None:
                progress({"point": i + 1, "points": len(ts), "t": t})
    finally:
        load_weights(model, path.start)
    return rows
