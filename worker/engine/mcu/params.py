"""Parameters of a connectivity run, checked like the unlearning parameters (one error names the field)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from worker.engine.errors import EngineInputError
from worker.engine.param_base import build

CURVES = ("linear", "bezier")
SPACES = ("auto", "full", "lora")


@dataclass
class McuParams:
    curve: str = "linear"
    points: int = 11  # T: t = 0, 1/(T-1), ..., 1
    tolerance: float = 0.05  # nats: MCU holds when both barriers are at most this
    # The Bezier control point (SPEC 6): trained with t ~ U(0, 1) on L_retain + lambda_forget * hinge_forget.
    # "lora": the midpoint plus a trainable rank-r delta on each differing matrix; "full": a full copy of
    # each differing tensor; "auto": lora when only LoRA-adaptable matrices differ (both ends LoRA-derived).
    space: str = "auto"
    lora_r: int = 16
    fit_steps: int = 100
    fit_lr: float = 1e-3
    lambda_forget: float = 1.0
    batch_size: int = 8
    eval_batch_size: int = 16
    # The margin that defines V and the hinge (MASC's defaults).
    k: int = 10
    rho: float = 0.5
    eta: float = 0.5
    beta: float = 1.0
    # Suppress-first: a memorisation has "fallen" at the t where it has made this fraction of its drop.
    suppress_fraction: float = 0.5
    min_drop: float = 0.02  # below this, a metric is said not to fall at all
    ensemble: bool = False
    ensemble_points: int = 5  # T_e interior points
    max_retain: int = 100  # retain records evaluated (seeded sample)
    max_length: int = 0
    seed: int = 0

    @classmethod
    def from_dict(cls, values: dict | None = None) -> McuParams:
        """JSON or CLI values, coerced by the unlearning parameters' own rules; unknown names refused."""
        return build(cls, values or {}, "MCU parameter")

    def need(self, ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise EngineInputError(f"MCU parameter {name}={getattr(self, name)!r}: {rule}", field=name)

    def validate(self) -> None:
        need = self.need
        need(self.curve in CURVES, "curve", f"must be one of {', '.join(CURVES)}")
        need(self.space in SPACES, "space", f"must be one of {', '.join(SPACES)}")
        need(3 <= self.points <= 101, "points", "must lie in [3, 101]")
        need(self.tolerance >= 0, "tolerance", "must be >= 0")
        need(1 <= self.lora_r <= 4096, "lora_r", "must lie in [1, 4096]")
        need(0 <= self.fit_steps <= 100_000, "fit_steps", "must lie in [0, 100000]")
        need(0 < self.fit_lr <= 1, "fit_lr", "must lie in (0, 1]")
        need(self.lambda_forget >= 0, "lambda_forget", "must be >= 0")
        need(1 <= self.batch_size <= 4096, "batch_size", "must lie in [1, 4096]")
        need(1 <= self.eval_batch_size <= 4096, "eval_batch_size", "must lie in [1, 4096]")
        need(self.k >= 1, "k", "must be >= 1")
        need(0 < self.rho < 1, "rho", "must lie in (0, 1)")
        need(self.eta > 0, "eta", "must be > 0")
        need(self.beta > 0, "beta", "must be > 0")
        need(0 < self.suppress_fraction < 1, "suppress_fraction", "must lie in (0, 1)")
        need(self.min_drop >= 0, "min_drop", "must be >= 0")
        need(1 <= self.ensemble_points <= 99, "ensemble_points", "must lie in [1, 99]")
        need(self.max_retain >= 1, "max_retain", "must be >= 1")
        need(self.max_length >= 0, "max_length", "must be >= 0")

    @property
    def ts(self) -> list[float]:
        return [i / (self.points - 1) for i in range(self.points)]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
