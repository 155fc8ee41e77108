"""Parameters of the fixed-budget baselines (SPEC section 4), with each method's published defaults."""
from __future__ import annotations

from dataclasses import dataclass

from worker.engine.errors import EngineInputError
from worker.engine.param_base import SharedParams

BASELINES = ("ga", "graddiff", "npo", "npo_kl", "simnpo", "rmu")
# What SPEC section 4 gives per method; everything else is shared.
METHOD_DEFAULTS = {
    "ga": {}, "graddiff": {"forget_weight": 1.0, "retain_weight": 1.0},
    "npo": {"beta": 0.1, "retain_weight": 1.0}, "npo_kl": {"beta": 0.1, "retain_weight": 1.0},
    "simnpo": {"beta": 4.5, "delta": 0.0, "forget_weight": 0.125, "retain_weight": 1.0},
    "rmu": {"retain_weight": 100.0},
}


@dataclass
class BaselineParams(SharedParams):
    method: str = "graddiff"
    # Objective weights: GradDiff's gamma is forget_weight and alpha retain_weight; RMU's alpha is retain_weight.
    forget_weight: float = 1.0
    retain_weight: float = 1.0
    beta: float = 0.1  # NPO / SimNPO inverse temperature
    delta: float = 0.0  # SimNPO margin
    rmu_layer: int = -1  # -1: about a quarter of the depth
    rmu_c: float = 20.0
    # The field's default budget: 10 epochs, AdamW, weight decay 0.01, linear schedule, one warm-up
    # epoch, effective batch 32 (micro-batches of batch_size accumulated).
    epochs: float = 10.0
    lr: float = 0.0  # 0: 1e-4 with LoRA, 1e-5 full
    weight_decay: float = 0.01
    warmup_epochs: float = 1.0
    effective_batch: int = 32  # micro-batches of batch_size are accumulated up to it

    @classmethod
    def from_dict(cls, method: str, values: dict | None = None) -> BaselineParams:
        if method not in BASELINES:
            raise EngineInputError(f"unknown method {method!r}", field="method")
        values = dict(values or {})
        if "method" in values:
            raise EngineInputError("unknown parameter 'method': the method is named outside params", field="method")
        try:
            params = cls._build({"method": method, **METHOD_DEFAULTS[method], **values, "lr": values.get("lr", 0.0)})
        except EngineInputError as exc:
            if str(exc).startswith("unknown parameter"):
                raise EngineInputError(f"{exc} for method {method}", field=exc.field) from None
            raise
        return params

    def validate(self) -> None:
        if self.lr == 0:  # the field's default depends on the parameter space
            self.lr = 1e-4 if self.lora else 1e-5
        super().validate()
        need = self.need
        need(0 < self.epochs <= 10_000, "epochs", "must lie in (0, 10000]")
        need(0 < self.lr <= 1, "lr", "must lie in (0, 1]")
        need(self.beta > 0, "beta", "must be > 0")
        need(self.forget_weight > 0, "forget_weight", "must be > 0")
        need(self.retain_weight >= 0, "retain_weight", "must be >= 0")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(self.warmup_epochs >= 0, "warmup_epochs", "must be >= 0")
        need(self.effective_batch >= self.batch_size, "effective_batch", "must be >= batch_size")
        need(self.rmu_c > 0, "rmu_c", "must be > 0")
