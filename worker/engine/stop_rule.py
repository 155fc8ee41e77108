"""MASC's online stop rule (SPEC section 3): a cheap trigger, then a confirmation on D_val.

The rule only decides; the caller measures. `check` takes two callables so that a scripted sequence
of V values drives it exactly as the trainer's measurements do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable


def hoeffding_bound(v: float, n: int, delta: float, j: int) -> float:
    """Upper confidence bound V + sqrt(log(1/delta_j) / 2n), delta_j = 6 delta / (pi^2 j^2)."""
    delta_j = 6 * delta / (math.pi ** 2 * j ** 2)
    return v + math.sqrt(math.log(1 / delta_j) / (2 * n))


@dataclass
class OnlineStopRule:
    alpha: float
    check_every: int
    hoeffding: bool = False
    delta: float = 0.05
    trace: list[dict] = field(default_factory=list)
    confirmations: int = 0

    def due(self, step: int) -> bool:
        return step % self.check_every == 0

    @property
    def latest_v(self) -> float | None:
        return self.trace[-1]["v"] if self.trace else None

    def check(self, step: int, trigger: Callable[[], tuple[float, int]],
              confirm: Callable[[], tuple[float, int]]) -> bool:
        """Run the trigger; when it is <= alpha, confirm on D_val. True: stop here."""
        v, n = trigger()
        self.trace.append({"step": step, "stage": "trigger", "v": v, "n": n, "passed": v <= self.alpha})
        if v > self.alpha:
            return False
        v, n = confirm()
        self.confirmations += 1
        entry = {"step": step, "stage": "confirm", "v": v, "n": n}
        statistic = v
        if self.hoeffding:
            statistic = hoeffding_bound(v, n, self.delta, self.confirmations)
            entry["upper_bound"] = statistic
        entry["passed"] = statistic <= self.alpha
        self.trace.append(entry)
        return entry["passed"]
