"""What the loop trains next: forget batches from the records the rule still finds dominant, and a
forget weight that starts gentle and rises only when the rule stops making progress."""
from __future__ import annotations

import math
import random
from typing import Callable

from worker.engine.records import EncodedRecord


class ForgetStream:
    """Forget batches from the records the rule still finds dominant ("open"), each open record once per
    pass in a seeded order. A record that meets the rule gets no more forget gradient, so nothing is
    suppressed further than the request needs."""

    def __init__(self, records: list[EncodedRecord], batch_size: int, rng: random.Random):
        self.records, self.batch_size, self.rng = records, batch_size, rng
        self.pending: list[EncodedRecord] = []

    def next(self, is_open: Callable[[str], bool]) -> list[EncodedRecord]:
        batch: list[EncodedRecord] = []
        refilled = False
        while len(batch) < self.batch_size:
            if not self.pending:
                if refilled:
                    break
                self.pending = [r for r in self.records if is_open(r.id)]
                self.rng.shuffle(self.pending)
                refilled = True
                if not self.pending:
                    break
            record = self.pending.pop()
            if is_open(record.id) and record not in batch:
                batch.append(record)
        return batch


class Escalation:
    """Start gentle, and double the forget weight when the rule stops making progress: after `patience`
    checks whose shortfall is not 1 % below the best so far (up to a weight of 1). The default weight suits
    the models measured; this keeps the rule firing on models nobody tuned it for."""

    CEILING = 1.0

    def __init__(self, patience: int):
        self.patience, self.best, self.stale = patience, math.inf, 0
        self.trace: list[dict] = []

    def update(self, step: int, shortfall: float | None, weight: float) -> float:
        if shortfall is None:
            return weight
        if shortfall < 0.99 * self.best:
            self.best, self.stale = shortfall, 0
            return weight
        self.stale += 1
        if not self.patience or self.stale < self.patience or weight >= self.CEILING:
            return weight
        self.stale, self.best = 0, shortfall
        weight = min(self.CEILING, 2 * weight)
        self.trace.append({"step": step, "lambda_forget": weight, "shortfall": shortfall})
        return weight
