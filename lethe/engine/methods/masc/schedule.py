"""What the loop trains next: forget batches from the records the rule still finds dominant, and a
forget weight that starts gentle and rises only when the rule stops making progress."""
from __future__ import annotations

import math
import random
from collections.abc import Callable

from lethe.engine.data.records import EncodedRecord


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
    """Start gentle, and double the forget weight (up to `ceiling`: lambda_forget_max, default 1) when the rule
    stops making progress: after `patience` checks whose shortfall is not 1 % below the best so far, or, given
    `max_steps`, when the pace of the last `patience` checks would not bring the shortfall to 0 before max_steps
    (steady but too slow: a secret's probability falling a few per cent per check). The default weight suits the
    models measured; this keeps the rule firing on models nobody tuned it for."""

    CEILING = 1.0

    def __init__(self, patience: int, max_steps: int | None = None, ceiling: float = CEILING):
        self.patience, self.max_steps, self.best, self.stale = patience, max_steps, math.inf, 0
        self.ceiling = ceiling
        self.window: list[tuple[int, float]] = []  # (step, shortfall) of the checks since the last doubling
        self.trace: list[dict] = []

    def _too_slow(self, step: int, shortfall: float) -> bool:
        if not self.max_steps or len(self.window) < self.patience:
            return False
        first_step, first = self.window[-self.patience]
        rate = (first - shortfall) / max(1, step - first_step)  # shortfall removed per step, lately
        return rate <= 0 or shortfall / rate > self.max_steps - step

    def update(self, step: int, shortfall: float | None, weight: float) -> float:
        if shortfall is None or not self.patience or weight >= self.ceiling:
            return weight
        self.window.append((step, shortfall))
        progress = shortfall < 0.99 * self.best
        if progress:
            self.best, self.stale = shortfall, 0
        else:
            self.stale += 1
        if self.stale < self.patience and not self._too_slow(step, shortfall):
            return weight
        self.stale, self.best, self.window = 0, shortfall, []
        weight = min(self.ceiling, 2 * weight)
        self.trace.append({"step": step, "lambda_forget": weight, "shortfall": shortfall,
                           "why": "no progress" if not progress else "too slow for max_steps"})
        return weight
