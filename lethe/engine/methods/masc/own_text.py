"""Own text (issue 28): the start model's own samples, kept beside the retain records by the retain term.

A retain term keeps only what its records say. Over a stream of requests every run wears down the margins of what
no retain record holds (mini-TOFU: after eight runs half the 57 world facts no retain record holds sat within 2
logits of flipping, under every anchor), while one request run alone from the root costs them nothing. The model's
own samples reach what it knows beyond the retain records, in proportion to how it says it: before training, the
start model (theta_0 of the run, which has already forgotten what earlier runs erased) writes `own_text_samples`
texts after the records' shared opening (their common first tokens, or the beginning of sequence), and each retain
batch draws a share of its rows from them. The retain term treats them as it treats a retain record: KL to the
anchor's lineage reference (lethe.engine.methods.masc.margin.lineage_reference), which pulls a drifted token back
to where the anchor had it and nothing else towards what the anchor knows.

A sample that says a word of the forget records that no retain record and no function word says is dropped: it is
about a record being erased, and keeping it would keep what the run erases."""
from __future__ import annotations

import random
import re
from collections.abc import Iterable
from typing import Any

from lethe.engine.data.function_words import FUNCTION_WORDS
from lethe.engine.data.records import IGNORE, EncodedRecord
from lethe.engine.model.generation import continuations

WORD = re.compile(r"[^\W_]+")
TEXT_FIELDS = ("prompt", "completion", "paraphrased_prompt", "paraphrased_completion", "text")
OPENING_CAP = 8  # tokens of the records' shared opening a sample starts from


def words(texts: Iterable[str]) -> set[str]:
    return {w.lower() for t in texts for w in WORD.findall(t)}


def source_texts(sources: Iterable[dict]) -> list[str]:
    return [t for s in sources for f in TEXT_FIELDS if isinstance(t := s.get(f), str)]


def forget_only_words(forget_sources: list[dict], retain_sources: list[dict]) -> set[str]:
    """The words the forget records say that no retain record and no function word says."""
    return words(source_texts(forget_sources)) - words(source_texts(retain_sources)) - FUNCTION_WORDS


def shared_opening(records: list[EncodedRecord], tokenizer: Any, cap: int = OPENING_CAP) -> list[int]:
    """The tokens every record's prompt starts with (at most `cap`), or the beginning of sequence (the end of
    sequence where the tokenizer has none, as GPT-2 starts its texts) when they share none."""
    prompts = [r.input_ids[:r.prompt_len] for r in records if r.prompt_len]
    opening: list[int] = []
    if prompts:
        for column in zip(*prompts):
            if len(opening) >= cap or any(t != column[0] for t in column):
                break
            opening.append(column[0])
    if opening:
        return opening
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return [start]


def own_text(model: Any, tokenizer: Any, forget: list[EncodedRecord], retain: list[EncodedRecord], *, samples: int,
             max_new_tokens: int, seed: int, batch_size: int = 16) -> tuple[list[EncodedRecord], dict]:
    """`samples` texts the model writes after the retain records' shared opening (seeded, temperature 1), as retain
    rows whose every written token is active, less those about the forget records; and what was kept and why."""
    opening = shared_opening(retain, tokenizer)
    written = continuations(model, tokenizer, [opening] * samples, max_new_tokens=max_new_tokens, sample=True,
                            seed=seed, batch_size=batch_size)
    banned = forget_only_words([r.source for r in forget], [r.source for r in retain])
    kept: list[EncodedRecord] = []
    about_forget = too_short = 0
    for i, tokens in enumerate(written):
        if len(tokens) < 2:
            too_short += 1
            continue
        if words([tokenizer.decode(tokens, skip_special_tokens=True)]) & banned:
            about_forget += 1
            continue
        ids = opening + tokens
        kept.append(EncodedRecord(id=f"own-text-{i}", input_ids=ids, labels=[IGNORE] * len(opening) + tokens,
                                  prompt_len=len(opening), source={"own_text": True}))
    return kept, {"asked": samples, "kept": len(kept), "about_forget_records": about_forget,
                  "too_short": too_short, "opening_tokens": len(opening)}


class OwnTextRows:
    """Each retain batch's share of own-text rows (each row kept with probability `share`, seeded)."""

    def __init__(self, rows: list[EncodedRecord], share: float, rng: random.Random):
        self.rows, self.share, self.rng = rows, share, rng

    def mix(self, retain_rows: list[EncodedRecord]) -> list[EncodedRecord]:
        if not self.rows or self.share <= 0:
            return retain_rows
        return [self.rng.choice(self.rows) if self.rng.random() < self.share else r for r in retain_rows]


def own_text_rows(model: Any, tokenizer: Any, forget: list[EncodedRecord], retain: list[EncodedRecord], params: Any
                  ) -> tuple[OwnTextRows | None, dict | None]:
    """The run's own-text rows and their summary (None, None: off, or no retain records to keep them beside). The
    rows are drawn with their own seeded generator, so the forget and retain streams stay as they are without them."""
    if not retain or params.own_text_samples <= 0 or params.own_text_share <= 0:
        return None, None
    rows, summary = own_text(model, tokenizer, forget, retain, samples=params.own_text_samples,
                             max_new_tokens=params.own_text_tokens, seed=params.seed,
                             batch_size=params.eval_batch_size)
    summary["share_of_retain_rows"] = params.own_text_share
    return OwnTextRows(rows, params.own_text_share, random.Random(params.seed + 1)), summary
