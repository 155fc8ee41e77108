"""Generation (greedy, or sampled and seeded) and verbatim exact match. A metric is
{"value": aggregate, "per_record": {id: value}}."""
from __future__ import annotations

import torch

from lethe.engine.data.records import EncodedRecord
from lethe.engine.methods.masc.margin import argmax_gap
from lethe.engine.model.loading import autocast

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


# Below this lead a token's place as the argmax is left to generation to decide: a teacher-forced pass and a cached
# generation sum in different orders, and a near tie could go either way.
AGREEMENT_GAP = 1e-3


def _answer_logits(model, pad_id: int, prompts: list[list[int]], answers: list[list[int]], batch_size: int):
    """Per (prompt, answer), in order: the model's float logits predicting each answer token ([len(answer), V]),
    from one teacher-forced pass per batch of right-padded rows."""
    device = next(model.parameters()).device
    for start in range(0, len(prompts), batch_size):
        rows = list(zip(prompts[start:start + batch_size], answers[start:start + batch_size]))
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, a) in enumerate(rows):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            mask[i, :len(p) + len(a)] = 1
        with autocast(device):
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
        for i, (p, a) in enumerate(rows):
            yield logits[i, len(p) - 1:len(p) + len(a) - 1].float()


@torch.no_grad()
def greedy_agrees(model, pad_id: int, prompts: list[list[int]], answers: list[list[int]], *,
                  min_gap: float = AGREEMENT_GAP, batch_size: int = 16) -> list[bool]:
    """Per (prompt, answer): whether `model`'s greedy decoding gives exactly this answer back, read from one
    teacher-forced pass instead of a generation: at every answer position its token is the argmax given the prompt
    and the answer so far, ahead of every other token by at least `min_gap` logits. Greedy decoding is a function
    of those argmaxes, so where every one agrees it says the same tokens and stops where the answer stopped (at its
    end of sequence, or at the same token budget); False says only "generate to know"."""
    return [bool(len(a)) and bool((argmax_gap(z, torch.tensor(a, device=z.device)) >= min_gap).all())
            for z, a in zip(_answer_logits(model, pad_id, prompts, answers, batch_size), answers)]


@torch.no_grad()
def answer_logprobs(model, pad_id: int, prompts: list[list[int]], answers: list[list[int]], *,
                    batch_size: int = 16) -> list[torch.Tensor]:
    """Per (prompt, answer): log p of each answer token given the prompt and the answer before it ([len(answer)],
    CPU)."""
    return [torch.log_softmax(z, dim=-1).gather(1, torch.tensor(a, device=z.device)[:, None]).squeeze(1).cpu()
            for z, a in zip(_answer_logits(model, pad_id, prompts, answers, batch_size), answers)]


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
