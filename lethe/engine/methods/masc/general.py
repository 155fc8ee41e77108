"""What the model says in general, held: texts the anchor writes itself, kept as retain rows.

The retain term holds the retain records; knowledge nobody listed is held only where a retain row happens to share
its weights (issue 28: one request on the sequential fixture took model utility on 57 unlisted world facts from 0.998
to 0.859). Samples of the anchor at temperature 1 go where it puts its mass, so KL(anchor || pi_theta) on them holds
its distribution in proportion to how likely it is to say a thing, whatever the thing is. They start from the opening
the records share (a chat template's header, "Question:"), or from the start-of-sequence token, so they are the kind
of text the model is asked for.

A sample that says something of the request is dropped: holding it would hold what the request erases. It says
something of the request where it has a token n-gram of a forget record that no retain record has (the records'
shared template is in retain records too, a forgotten author's name is not), or gives back one of the request's
content spans."""
from __future__ import annotations

from typing import Any

from lethe.engine.data.records import IGNORE, EncodedRecord
from lethe.engine.data.secrets import leaks
from lethe.engine.model.generation import continuations

NGRAM = 4  # tokens: a name or a number is rarely shorter, a template phrase is shared with retain records anyway


def shared_opening(records: list[EncodedRecord], fallback: int | None) -> list[int]:
    """The longest prefix of token ids every record starts with (its prompt part only), else [fallback]."""
    prompts = [r.input_ids[:max(1, r.prompt_len)] for r in records]
    opening: list[int] = []
    for column in zip(*prompts):
        if any(t != column[0] for t in column):
            break
        opening.append(column[0])
    return opening or ([fallback] if fallback is not None else [])


def _ngrams(tokens: list[int]) -> set[tuple[int, ...]]:
    return {tuple(tokens[i:i + NGRAM]) for i in range(len(tokens) - NGRAM + 1)}


class RequestFilter:
    """Whether a text says something of the request (see the module's docstring)."""

    def __init__(self, forget: list[EncodedRecord], retain: list[EncodedRecord], spans: list[str]):
        kept = set().union(*(_ngrams(r.input_ids) for r in retain)) if retain else set()
        self.own = set().union(*(_ngrams(r.input_ids) for r in forget)) - kept if forget else set()
        self.spans = [s for s in spans if s.strip()]

    def says_request(self, tokens: list[int], text: str) -> bool:
        return bool(_ngrams(tokens) & self.own) or any(leaks(span, text) for span in self.spans)


def anchor_samples(model: Any, tokenizer, opening: list[int], count: int, *, max_new_tokens: int,
                   request: RequestFilter, seed: int, batch_size: int = 16) -> tuple[list[EncodedRecord], dict]:
    """Up to `count` samples of `model` after `opening` as retain rows (the opening inactive, every written token
    active), those that say something of the request left out; and what was drawn and dropped."""
    if count <= 0 or not opening:
        return [], {"drawn": 0, "kept": 0, "dropped_as_request": 0, "empty": 0}
    written = continuations(model, tokenizer, [opening], max_new_tokens=max_new_tokens, sample=True, n=count,
                            seed=seed, batch_size=batch_size)
    rows, dropped, empty = [], 0, 0
    for i, tokens in enumerate(written):
        if not tokens:
            empty += 1
            continue
        if request.says_request(opening[-NGRAM + 1:] + tokens, tokenizer.decode(tokens, skip_special_tokens=True)):
            dropped += 1
            continue
        ids = opening + tokens
        rows.append(EncodedRecord(id=f"anchor-sample-{i}", input_ids=ids,
                                  labels=[IGNORE] * len(opening) + tokens, prompt_len=len(opening)))
    return rows, {"drawn": count, "kept": len(rows), "dropped_as_request": dropped, "empty": empty,
                  "opening_tokens": len(opening)}
