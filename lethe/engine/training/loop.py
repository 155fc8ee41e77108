"""The training loop every method shares: ask the stop policy whether to stop, take its batches, step the
optimiser, record the losses, report progress. The objective decides what a step minimises; the stop policy
decides which records a step sees and when training ends (MASC's online rule, or a fixed budget)."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from lethe.engine.data.records import Batch
from lethe.engine.methods import Objective
from lethe.engine.model.precision import Precision


class StopPolicy(Protocol):
    """What the loop asks of a stop policy (methods.masc.stop_policy.MascStopPolicy, training.budget.FixedBudget)."""
    @property
    def max_steps(self) -> int:
        """What progress reports as the run's length (the budget, or the safety cap)."""

    @property
    def accumulate(self) -> int:
        """Micro-batches whose gradients make one optimiser step (each loss is divided by it)."""

    @property
    def latest_v(self) -> float | None:
        """The last V the policy measured, for progress."""

    @property
    def alpha(self) -> float | None:
        """The V the policy stops at (None: it stops on a budget), for progress."""

    def stop_before(self, step: int) -> str | None:
        """The stop reason before optimiser step `step` (0-based), or None to take it."""

    def batches(self, step: int) -> Iterable[tuple[Batch | None, Batch | None]]:
        """The (forget, retain) micro-batches of this step, on the device."""

    def observe(self, objective: Any) -> None:
        """After each micro-batch's forward pass: what the objective measured on the way (MASC's per-record state)."""

    def trace_extra(self) -> dict:
        """What the loss trace records of this step beyond the losses."""

    def schedule(self, optimiser: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler | None:
        """The learning-rate schedule (None: constant)."""


@dataclass
class Trained:
    """What the loop did: steps taken, why it stopped, the loss per step, when and how long it ran."""
    steps: int
    stop_reason: str
    loss_trace: list[dict]
    loop_started: float
    loop_seconds: float


def train(objective: Objective, stop: StopPolicy, parameters: list[torch.nn.Parameter], *, lr: float,
          weight_decay: float, grad_clip: float, precision: Precision, started: float,
          should_cancel: Callable[[], bool] | None = None, progress: Callable[[dict], None] | None = None) -> Trained:
    """Train `parameters` with AdamW on the objective's loss over the stop policy's batches until it stops or
    `should_cancel` says so; forward passes in the run's precision (autocast in full mode, a scaled loss in
    float16)."""
    optimiser = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    scaler = precision.scaler()
    model = objective.trainable.model
    schedule = stop.schedule(optimiser)
    loop_started = time.perf_counter()
    step, loss_trace = 0, []
    while True:
        stop_reason = stop.stop_before(step)
        if stop_reason is None and should_cancel is not None and should_cancel():
            stop_reason = "cancelled"
        if stop_reason is not None:
            break
        parts: dict[str, float] = {}
        for forget_batch, retain_batch in stop.batches(step):
            with precision.autocast(model):
                loss, parts = objective.loss(forget_batch, retain_batch)
            stop.observe(objective)
            scaled = loss / stop.accumulate
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        if scaler is not None:
            scaler.unscale_(optimiser)
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        if scaler is not None:
            scaler.step(optimiser)  # skipped where the scaled gradients overflowed
            scaler.update()
        else:
            optimiser.step()
        objective.trainable.after_step()
        if schedule is not None:
            schedule.step()
        optimiser.zero_grad(set_to_none=True)
        step += 1
        if not math.isfinite(parts["total"]):
            raise FloatingPointError(f"loss became {parts['total']} at step {step}")
        loss_trace.append({"step": step, **parts, **stop.trace_extra()})
        if progress is not None:
            progress({"step": step, "max_steps": stop.max_steps, "losses": parts, "violation_rate": stop.latest_v,
                      "alpha": stop.alpha, "elapsed": time.perf_counter() - started})
    return Trained(step, stop_reason, loss_trace, loop_started, time.perf_counter() - loop_started)
