"""Parameters of the fixed-budget baselines (SPEC section 4), with each method's published defaults."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from worker.engine.errors import EngineInputError

BASELINES = ("ga", "graddiff", "npo", "npo_kl", "simnpo", "rmu")
# What SPEC section 4 gives per method; everything else is shared.
METHOD_DEFAULTS = {
    "ga": {}, "graddiff": {"forget_weight": 1.0, "retain_weight": 1.0},
    "npo": {"beta": 0.1, "retain_weight": 1.0}, "npo_kl": {"beta": 0.1, "retain_weight": 1.0},
    "simnpo": {"beta": 4.5, "delta": 0.0, "forget_weight": 0.125, "retain_weight": 1.0},
    "rmu": {"retain_weight": 100.0},
}


@dataclass
class BaselineParams:
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
    effective_batch: int = 32
    batch_size: int = 4
    lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    max_length: int = 0
    eval_batch_size: int = 16
    grad_clip: float = 1.0
    seed: int = 0

    @classmethod
    def from_dict(cls, method: str, values: dict | None = None) -> "BaselineParams":
        from worker.engine.params import _coerce

        if method not in BASELINES:
            raise EngineInputError(f"unknown method {method!r}", field="method")
        known = {f.name: f for f in fields(cls)}
        merged = {"method": method, **METHOD_DEFAULTS[method]}
        for name, value in (values or {}).items():
            if name not in known or name == "method":
                raise EngineInputError(f"unknown parameter {name!r} for method {method}", field=name)
            merged[name] = value
        params = cls(**{name: _coerce(known[name], value) for name, value in merged.items()})
        if params.lr == 0:
            params.lr = 1e-4 if params.lora else 1e-5
        params.validate()
        return params

    def validate(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise EngineInputError(f"parameter {name}={getattr(self, name)!r}: {rule}", field=name)

        need(self.epochs > 0, "epochs", "must be > 0")
        need(self.lr > 0, "lr", "must be > 0")
        need(self.beta > 0, "beta", "must be > 0")
        need(self.forget_weight > 0, "forget_weight", "must be > 0")
        need(self.retain_weight >= 0, "retain_weight", "must be >= 0")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(self.warmup_epochs >= 0, "warmup_epochs", "must be >= 0")
        need(self.batch_size >= 1, "batch_size", "must be >= 1")
        need(self.effective_batch >= self.batch_size, "effective_batch", "must be >= batch_size")
        need(self.rmu_c > 0, "rmu_c", "must be > 0")
        need(self.lora_r >= 1, "lora_r", "must be >= 1")
        need(len(self.lora_targets) > 0, "lora_targets", "must name at least one module")
        need(self.max_length >= 0, "max_length", "must be >= 0")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
