"""The baselines' stop policy (SPEC section 4): a fixed budget of epochs over the forget set, each forget
example paired with a random retain example, micro-batches accumulated to the effective batch, a linear
schedule with a warm-up epoch. No stop rule: the budget is the point of comparison. At the end V is measured
with MASC's default margin, so that every method reports the same statistic."""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lethe.engine.data.records import Batch, EncodedRecord, collate
from lethe.engine.methods import Objective
from lethe.engine.methods.baseline_params import BaselineParams
from lethe.engine.methods.masc.bound import exact_reproduction_bound
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.training.result import BudgetEvidence, Measured
from lethe.engine.training.setup import Prepared


def linear_schedule(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The learning-rate factor per step: a linear warm-up, then a linear decay to 0 at total_steps."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return factor


class FixedBudget:
    """The stop policy of the baselines: a fixed number of optimiser steps, then V measured once."""
    latest_v: float | None = None  # nothing is measured while the budget runs
    alpha: float | None = None  # nor is there a V to reach
    calibration_seconds: float | None = None  # nor calibrated before it
    stop_check_seconds = 0.0

    def __init__(self, run: Prepared, params: BaselineParams):
        self.run, self.params = run, params
        self.accumulate = max(1, params.effective_batch // params.batch_size)
        self.micro_per_epoch = math.ceil(len(run.forget) / params.batch_size)
        self.total_micro = math.ceil(params.epochs * self.micro_per_epoch)
        self.max_steps = math.ceil(self.total_micro / self.accumulate)
        self.rng = random.Random(params.seed)
        self.stream = self._forget_batches()
        self.micro_done = 0

    def start(self, objective: Objective) -> None:
        """Keep the objective: its policy measures the yardstick V at the end."""
        self.objective = objective

    def _forget_batches(self) -> Iterator[list[EncodedRecord]]:
        """Epochs over the forget set, each in a seeded order."""
        while True:
            order = self.run.forget[:]
            self.rng.shuffle(order)
            for start in range(0, len(order), self.params.batch_size):
                yield order[start:start + self.params.batch_size]

    def stop_before(self, step: int) -> str | None:
        """Stop once every micro-batch of the budget has been trained."""
        return "budget" if self.micro_done >= self.total_micro else None

    def batches(self, step: int) -> Iterator[tuple[Batch | None, Batch | None]]:
        """The step's micro-batches: forget records in a seeded epoch order, each paired with a random retain
        record."""
        pad, dev = self.run.tokenizer.pad_token_id, self.run.device
        for _ in range(min(self.accumulate, self.total_micro - self.micro_done)):
            forget = collate(next(self.stream), pad).to(dev)
            retain = collate(self.rng.choices(self.run.retain, k=len(forget)), pad).to(dev) if self.run.retain \
                else None
            self.micro_done += 1
            yield forget, retain

    def observe(self, objective: Any) -> None:
        pass

    def trace_extra(self) -> dict:
        return {}

    def schedule(self, optimiser: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        warmup = round(self.params.warmup_epochs * self.micro_per_epoch / self.accumulate)
        return torch.optim.lr_scheduler.LambdaLR(optimiser, linear_schedule(warmup, self.max_steps))

    def finish(self, stop_reason: str) -> Measured:
        """V of every forget record on MASC's default margin (none when cancelled), and the budget's size."""
        run = self.run
        counts = {"forget": len(run.forget), "retain": len(run.retain)}
        if stop_reason == "cancelled":
            return Measured(None, None, None, {"mode": "none (fixed budget)"}, counts, [],
                            BudgetEvidence(self.max_steps, None))
        yardstick = MascParams().resolved()  # the common margin: k 10, rho 0.5, beta 1
        checks = Masc(yardstick, self.objective.trainable, run.tokenizer.pad_token_id).check_records(
            run.forget, self.params.eval_batch_size)
        per_record = [{"id": c.id, "violation": c.violation, "active_tokens": c.active_tokens,
                       "reproduced": c.reproduced} for c in checks]
        return Measured(sum(c.violation for c in checks) / len(checks), per_record,
                        exact_reproduction_bound(yardstick.rho, yardstick.beta, per_record),
                        {"mode": "none (fixed budget)"}, counts, [],
                        BudgetEvidence(self.max_steps, {"k": yardstick.k, "rho": yardstick.rho,
                                                        "beta": yardstick.beta}))
