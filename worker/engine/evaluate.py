"""Generation (greedy, or sampled and seeded) and verbatim exact match. A metric is
{"value": aggregate, "per_record": {id: value}}."""
from __future__ import annotations

import torch

from worker.engine.loading import autocast
from worker.engine.records import EncodedRecord

MAX_NEW_TOKENS = 128  # SPEC 5: long enough to see past a preamble, not cut at the target's length


@torch.no_grad()
def continuations(model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int = MAX_NEW_TOKENS,
                  sample: bool = False, n: int = 1, seed: int = 0, batch_size: int = 16) -> list[list[int]]:
    """The tokens generated after each prompt, left-padded in batches with the KV cache, up to EOS or
    `max_new_tokens`. Greedy, or `n` samples per prompt at temperature 1 with no top-k or top-p cut
    (seeded: the same call gives the same samples); samples of one prompt come one after another."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    if sample:
        torch.manual_seed(seed)  # seeds CUDA too
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        options = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=n) if sample \
            else dict(do_sample=False)
        with autocast(device):
            generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                       pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, **options)
        out += [_until_eos(row, tokenizer.eos_token_id) for row in generated[:, width:].tolist()]
    return out


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    """A row up to and including its first EOS (generate pads finished rows after it)."""
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def greedy_continuations(model, tokenizer, records: list[EncodedRecord], *, batch_size: int = 16,
                         max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    """Greedy continuations of each record's prompt."""
    return continuations(model, tokenizer, [r.input_ids[:r.prompt_len] for r in records],
                         max_new_tokens=max_new_tokens, batch_size=batch_size)


def exact_match(model, tokenizer, records: list[EncodedRecord], *, batch_size: int = 16) -> dict:
    """1 where greedy decoding reproduces the active tokens (completion and EOS) exactly."""
    generated = greedy_continuations(model, tokenizer, records, batch_size=batch_size)
    per_record = {}
    for record, tokens in zip(records, generated):
        target = record.input_ids[record.prompt_len:]
        per_record[record.id] = float(tokens[:len(target)] == target)
    return {"value": sum(per_record.values()) / len(per_record), "per_record": per_record}
