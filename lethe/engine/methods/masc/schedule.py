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


def pace_horizon(content: bool, pace_steps: int, max_steps: int) -> int | None:
    """The step by which the escalation's pace aims to fire: pace_steps, or max_steps where that comes first; none
    for whole records (issue 11)."""
    return min(pace_steps, max_steps) if content else None


class Escalation:
    """Start gentle, and double the forget weight (up to `ceiling`: the run passes lambda_forget_max) when the rule
    stops making progress: after `patience` checks whose shortfall is not 1 % below the best so far, or, given a
    `horizon` (pace_steps), when the pace of the last `patience` checks would not bring the shortfall to 0 by it
    (steady but too slow: a secret's probability falling a few per cent per check). The default weight suits the
    models measured; this keeps the rule firing on models nobody tuned it for."""

    CEILING = 1.0

    def __init__(self, patience: int, horizon: int | None = None, ceiling: float = CEILING):
        self.patience, self.horizon, self.best, self.stale = patience, horizon, math.inf, 0
        self.ceiling = ceiling
        self.window: list[tuple[int, float]] = []  # (step, shortfall) of the checks since the last doubling
        self.trace: list[dict] = []

    def _too_slow(self, step: int, shortfall: float) -> bool:
        if not self.horizon or len(self.window) < self.patience:
            return False
        first_step, first = self.window[-self.patience]
        rate = (first - shortfall) / max(1, step - first_step)  # shortfall removed per step, lately
        return rate <= 0 or shortfall / rate > self.horizon - step

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
                           "why": "no progress" if not progress else "too slow for pace_steps"})
        return weight
