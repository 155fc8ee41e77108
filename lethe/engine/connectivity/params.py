"""Parameters of a connectivity run (SPEC section 6), declared like the unlearning parameters (one error
names the field). Within an unlearning job the margin (k, rho, eta, beta) is the job's own
(lethe.engine.job_spec)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.parameters import build, check_rules, param

MARGIN_FIELDS = ("k", "rho", "eta", "beta")  # the restricted margin that defines V and the hinge


@dataclass
class ConnectivityParams:
    curve: str = param("linear", "the path: the straight line, or a quadratic Bezier curve with a trained control "
                                 "point", choices=("linear", "bezier"))
    points: int = param(11, "T: the curve is evaluated at t = 0, 1/(T-1), ..., 1", ge=3, le=101)
    tolerance: float = param(0.05, "nats: MCU holds when both barriers are at most this", ge=0, le=1e6)
    # "lora": the midpoint plus a trainable rank-r delta on each differing matrix; "full": a full copy of each
    # differing tensor; "auto": lora when only LoRA-adaptable matrices differ (both ends LoRA-derived).
    space: str = param("auto", "Bezier control point over LoRA-style rank-r deltas or full tensors; \"auto\": "
                               "\"lora\" when only LoRA-adaptable matrices differ", choices=("auto", "full", "lora"))
    lora_r: int = param(16, "rank of the control point's deltas in the \"lora\" space", ge=1, le=4096)
    fit_steps: int = param(100, "Bezier: optimiser steps fitting the control point (t ~ U(0, 1) per step)",
                           ge=0, le=100_000)
    fit_lr: float = param(1e-3, "Bezier: learning rate of the fit", gt=0, le=1)
    lambda_forget: float = param(1.0, "Bezier: weight of the forget hinge in the fit (L_retain + lambda * hinge)",
                                 ge=0)
    batch_size: int = param(8, "Bezier: records per fitting step", ge=1, le=4096)
    eval_batch_size: int = param(16, "records per forward pass when evaluating a point", ge=1, le=4096)
    k: int = param(10, "margin: alternatives (the unlearning job's own within a job)", ge=1, le=4096)
    rho: float = param(0.5, "margin: suppression threshold rho (the job's own within a job)", gt=0, lt=1)
    eta: float = param(0.5, "margin: hinge width (the job's own within a job)", gt=0)
    beta: float = param(1.0, "margin: inverse temperature (the job's own within a job)", gt=0)
    suppress_fraction: float = param(0.5, "suppress-first: a memorisation has fallen at the t where it has made "
                                          "this fraction of its drop", gt=0, lt=1)
    min_drop: float = param(0.02, "suppress-first: a smaller drop counts as not falling at all", ge=0)
    ensemble: bool = param(False, "also store the MCU ensemble (the weight average of interior points) as a version")
    ensemble_points: int = param(5, "T_e: interior points averaged by the ensemble", ge=1, le=99)
    max_retain: int = param(100, "retain records evaluated (a seeded sample)", ge=1)
    max_length: int = param(0, "longest sequence in tokens", ge=0, note="0: the model's context length")
    seed: int = param(0, "seed of the retain sample and the fit")

    @classmethod
    def from_dict(cls, values: dict | None = None) -> ConnectivityParams:
        """JSON or CLI values, coerced by the unlearning parameters' own rules; unknown names refused."""
        return build(cls, values or {}, "MCU parameter")

    def need(self, ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise EngineInputError(f"MCU parameter {name}={getattr(self, name)!r}: {rule}", field=name)

    def validate(self) -> None:
        check_rules(self, self.need)

    @property
    def ts(self) -> list[float]:
        return [i / (self.points - 1) for i in range(self.points)]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
