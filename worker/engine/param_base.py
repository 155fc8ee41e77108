"""What every method's parameters share: the common fields (SharedParams), and how a JSON or CLI value
becomes a checked parameter (coerce: kinds, "auto", ranges)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

from worker.engine.errors import EngineInputError


@dataclass
class SharedParams:
    """What every method has: the parameter space (LoRA or full), batching, lengths, the seed."""
    batch_size: int = 4
    grad_clip: float = 1.0
    lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    # "auto": every attention and MLP projection of the architecture (worker.engine.targets); or names.
    lora_targets: list[str] | str = "auto"
    max_length: int = 0  # 0: the model's context length
    eval_batch_size: int = 16
    seed: int = 0

    @classmethod
    def _build(cls, merged: dict):
        return build(cls, merged)

    def need(self, ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise EngineInputError(f"parameter {name}={getattr(self, name)!r}: {rule}", field=name)

    def validate(self) -> None:
        need = self.need
        need(1 <= self.batch_size <= 4096, "batch_size", "must lie in [1, 4096]")
        need(1 <= self.eval_batch_size <= 4096, "eval_batch_size", "must lie in [1, 4096]")
        need(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0: no clipping)")
        need(1 <= self.lora_r <= 4096, "lora_r", "must lie in [1, 4096]")
        need(self.lora_alpha > 0, "lora_alpha", "must be > 0")
        need(0 <= self.lora_dropout < 1, "lora_dropout", "must lie in [0, 1)")
        need(self.lora_targets == "auto" or (len(self.lora_targets) > 0 and "auto" not in self.lora_targets),
             "lora_targets", "must be \"auto\" or name at least one module")
        need(self.max_length >= 0, "max_length", "must be >= 0")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _number(value: float | str, name: str) -> float:
    if isinstance(value, str):
        raise ValueError(f"{name} is still {value!r}: resolve the parameters first (MascParams.resolved)")
    return value


def auto_or(value: float | str, rule: Callable[[float], bool]) -> bool:
    """A parameter that is "auto" or a number obeying `rule`."""
    return value == "auto" or (not isinstance(value, str) and rule(value))


def build(cls, values: dict, what: str = "parameter"):
    """An instance of the parameter dataclass `cls` from JSON or CLI values, coerced and validated; an unknown
    name raises, naming it (`what`: how the error calls a parameter)."""
    known = {f.name: f for f in fields(cls)}
    for name in values:
        if name not in known:
            raise EngineInputError(f"unknown {what} {name!r}", field=name)
    params = cls(**{name: coerce(known[name], value) for name, value in values.items()})
    params.validate()
    return params


# Past any sensible setting, and each rule below narrows its own: a job with lr 1e308 or max_steps 1e308
# was accepted and would have run (issue 12).
MAX_INT = 2**32 - 1  # a seed may use the whole 32-bit range
MAX_FLOAT = 1e6


def coerce(spec: dataclasses.Field, value):
    """Accept JSON/CLI values of the right kind; refuse the rest with the parameter's name."""
    kind = spec.type if isinstance(spec.type, str) else spec.type.__name__
    if "|" in kind:  # a value or "auto" (alpha, record_ceiling, lora_targets)
        if value == "auto" or value == ["auto"]:
            return "auto"
        kind = kind.split("|")[0].strip()
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            raise ValueError
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            if isinstance(value, str) and len(value) > 12:
                raise ValueError
            out = int(value)
            if abs(out) > MAX_INT:
                raise EngineInputError(f"parameter {spec.name}={value!r}: must lie within +-{MAX_INT}",
                                       field=spec.name)
            return out
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            if abs(number) > MAX_FLOAT:
                raise EngineInputError(f"parameter {spec.name}={value!r}: must lie within +-{MAX_FLOAT:g}",
                                       field=spec.name)
            return number
        if kind == "str":
            if not isinstance(value, str):
                raise ValueError
            return value
        if kind.startswith("list"):
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return list(value)
    except (TypeError, ValueError):
        raise EngineInputError(f"parameter {spec.name}={value!r}: expected {kind}", field=spec.name) from None
    return value
