"""On-policy replay (SPEC section 3): the model's own answers to the forget prompts, refreshed every few steps, read
by the stop rule (worker.engine.answers judges them) and trained on beside the records themselves."""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from worker.engine.answers import Answer, Answering
from worker.engine.records import EncodedRecord

GREEDY = ("prompt", "paraphrase")  # the answers the rule reads
REPLAYED = ("prompt", "paraphrase", "sample")  # the answers training replays


class Replays:
    """The latest replayed answers of each record, and what the greedy ones said."""

    def __init__(self, answering: Answering, reference: Callable, device: Any, seed: int):
        self.answering, self.reference, self.device, self.seed = answering, reference, device, seed
        self.examples: dict[str, list[EncodedRecord]] = {}
        self.refreshes = 0

    def refresh(self, model: Any, records: list[EncodedRecord]) -> dict[str, tuple[bool, bool]]:
        """Ask the model for its answers to these records' prompts (greedy to the prompt and the paraphrase, one
        sample), keep them as training examples with fresh targets, and say per record whether a greedy answer
        leaked or looped."""
        answers = self.answering.ask(model, records, REPLAYED, seed=self.seed * 7919 + self.refreshes)
        examples = [self.answering.replay_example(a) for a in answers]
        self.answering.set_targets(examples, self.reference, self.device, draw=self.refreshes)
        self.refreshes += 1
        fresh: dict[str, list[EncodedRecord]] = {}
        for answer, example in zip(answers, examples):
            fresh.setdefault(answer.record_id, []).append(example)
        self.examples.update(fresh)
        return verdicts(answers, records)

    def judge(self, model: Any, records: list[EncodedRecord]) -> dict[str, tuple[bool, bool]]:
        """Per record, whether the model's greedy answers leak or loop (nothing kept: a merged copy's check)."""
        return verdicts(self.answering.ask(model, records, GREEDY), records)

    def riding(self, chosen: list[EncodedRecord], size: int, rng: random.Random) -> list[EncodedRecord]:
        """The answers that ride along with a forget batch: the chosen records' own, then others up to `size`."""
        chosen_ids = {r.id for r in chosen}
        extra = [e for r in chosen for e in self.examples.get(r.id, [])]
        others = [e for rid, group in self.examples.items() if rid not in chosen_ids for e in group]
        return extra + rng.sample(others, min(len(others), max(0, size - len(extra))))

    @property
    def replayed_ids(self) -> list[str]:
        return sorted(self.examples)


def verdicts(answers: list[Answer], records: list[EncodedRecord]) -> dict[str, tuple[bool, bool]]:
    """Per record: (some greedy answer leaked, some greedy answer looped)."""
    out = {r.id: (False, False) for r in records}
    for a in answers:
        if a.kind in GREEDY:
            leaked, looped = out[a.record_id]
            out[a.record_id] = (leaked or a.leaked, looped or a.looped)
    return out
