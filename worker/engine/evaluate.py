"""Greedy generation and verbatim exact match. A metric is {"value": aggregate, "per_record": {id: value}}."""
from __future__ import annotations

import torch

from worker.engine.loading import autocast
from worker.engine.records import EncodedRecord


@torch.no_grad()
def greedy_continuations(model, tokenizer, records: list[EncodedRecord], *, batch_size: int = 16,
                         max_new_tokens: int | None = None) -> list[list[int]]:
    """Greedy continuations of each record's prompt, left-padded in batches with the KV cache."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    out: list[list[int]] = []
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        prompts = [r.input_ids[:r.prompt_len] for r in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        budget = max_new_tokens or max(len(r.input_ids) - r.prompt_len for r in chunk)
        with autocast(device):
            generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=budget,
                                       do_sample=False, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
        out += generated[:, width:].tolist()
    return out


def exact_match(model, tokenizer, records: list[EncodedRecord], *, batch_size: int = 16) -> dict:
    """1 where greedy decoding reproduces the active tokens (completion and EOS) exactly."""
    generated = greedy_continuations(model, tokenizer, records, batch_size=batch_size)
    per_record = {}
    for record, tokens in zip(records, generated):
        target = record.input_ids[record.prompt_len:]
        per_record[record.id] = float(tokens[:len(target)] == target)
    return {"value": sum(per_record.values()) / len(per_record), "per_record": per_record}
