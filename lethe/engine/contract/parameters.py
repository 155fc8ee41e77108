"""How a parameter is declared, once: its default, its help text and its rule (range, choices, "auto"). Validation,
the CLI's flags and --help, and the API's JSON schema all read that declaration (`param`). Also the fields every
method shares (SharedParams) and how a JSON or CLI value becomes a checked parameter (`build`, `coerce`)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from lethe.engine.contract.errors import EngineInputError

# Past any sensible setting, and each rule narrows its own: a job with lr 1e308 or max_steps 1e308 was accepted
# and would have run (issue 12).
MAX_INT = 2**32 - 1  # a seed may use the whole 32-bit range
MAX_FLOAT = 1e6


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e7 else f"{x:g}"


@dataclass(frozen=True)
class Rule:
    """What values a parameter takes: a range (bounds inclusive with ge/le, exclusive with gt/lt), or choices;
    `auto`: the string "auto" too; `note`: what a special value means, e.g. "0: off"."""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    auto: bool = False
    note: str = ""

    def allows(self, value: Any) -> bool:
        """Whether `value` obeys the rule."""
        if self.auto and value == "auto":
            return True
        if self.choices is not None:
            return any(value == c and type(value) is type(c) for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return not self.has_range()
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def has_range(self) -> bool:
        return any(b is not None for b in (self.ge, self.gt, self.le, self.lt))

    def values(self) -> str:
        """The values allowed, in words: "[1, 4096]", ">= 0", "'kl' or 'nll'" (no "auto")."""
        if self.choices is not None:
            names = [_choice(c) for c in self.choices]
            return "one of " + ", ".join(names) if len(names) > 3 else ", ".join(names[:-1]) + " or " + names[-1]
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else ""
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else ""
        if low and high:
            return f"{low}, {high}"
        if low:
            return (">= " if low[0] == "[" else "> ") + low[1:]
        return (("<= " if high[-1] == "]" else "< ") + high[:-1]) if high else ""

    def describe(self) -> str:
        """The rule as an error message says it: "must lie in (0, 1)", "must be \"auto\" or >= 0 (0: off)"."""
        values = self.values()
        phrase = f"lie in {values}" if values[:1] in "[(" and values else f"be {values}"
        if self.auto:
            phrase = "be \"auto\"" + (f" or {phrase.removeprefix('be ')}" if values else "")
        return "must " + phrase + (f" ({self.note})" if self.note else "")


def _choice(c: Any) -> str:
    if isinstance(c, bool):
        return "true" if c else "false"
    return f"\"{c}\"" if c == "auto" else repr(c)


def param(default: Any, help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None, choices: tuple | None = None, auto: bool = False, note: str = "") -> Any:
    """A parameter field: its default, its help text and its rule, declared once."""
    rule = Rule(ge, gt, le, lt, choices, auto, note)
    return field(default=default, metadata={"help": help, "rule": rule})


def internal(default: Any, help: str) -> Any:
    """A field the engine sets and a request does not (the method's name)."""
    return field(default=default, metadata={"help": help, "internal": True})


def rule_of(f: dataclasses.Field) -> Rule | None:
    """A field's declared rule, if it has one."""
    return f.metadata.get("rule")


def help_of(f: dataclasses.Field) -> str:
    """The field's help text with the values it takes, as --help and the API schema show it."""
    rule = rule_of(f) or Rule()
    values = rule.values()
    parts = [("\"auto\" or " if rule.auto else "") + values] if values else []
    parts += [rule.note] if rule.note else []
    return f.metadata.get("help", "") + (f" ({'; '.join(parts)})" if parts else "")


def user_fields(cls: type) -> list[dataclasses.Field]:
    """The fields a request or a flag may set."""
    return [f for f in fields(cls) if not f.metadata.get("internal")]


def check_rules(params: Any, need: Callable[[bool, str, str], None]) -> None:
    """Every field's declared rule, each failure raised through `need` (which names the field)."""
    for f in fields(params):
        rule = rule_of(f)
        if rule is not None and not rule.allows(getattr(params, f.name)):
            need(False, f.name, rule.describe())


@dataclass
class SharedParams:
    """What every method has: the parameter space (LoRA or full), batching, lengths, the seed."""
    method: str = internal("", "the method these parameters are for (set by the registry)")
    batch_size: int = param(4, "forget records per optimiser step (micro-batch with the baselines)", ge=1, le=4096)
    grad_clip: float = param(1.0, "gradient-norm clip", ge=0, note="0: no clipping")
    lora: bool | str = param(True, "train LoRA adapters (theta_0 = adapters off, no second copy); false: full "
                                   "fine-tuning with a frozen copy", choices=(True, False))
    lora_r: int = param(16, "rank of the LoRA adapters", ge=1, le=4096)
    lora_alpha: int = param(32, "LoRA scaling numerator (scale = lora_alpha / lora_r)", gt=0)
    lora_dropout: float = param(0.0, "dropout on the LoRA path", ge=0, lt=1)
    lora_targets: list[str] | str = param(
        "auto", "modules LoRA wraps: \"auto\" = every attention and MLP projection of the architecture, found "
                "automatically; or module names, comma-separated on the command line")
    # Issue 28: on the sequential fixture, full fine-tuning whitened so cost the world facts outside every retain set
    # about a quarter of the margin LoRA did for the same forget progress (BENCHMARKS.md, "Whitened updates").
    whiten_updates: bool = param(False, "full fine-tuning (lora false): each attention and MLP projection trains on "
                                        "its gradient times the inverse second moment of its inputs on the retain "
                                        "records (MEMIT's key covariance), so that an update moves the weights along "
                                        "directions retained text seldom uses; only those projections train")
    whiten_damping: float = param(0.1, "whiten_updates: added to the second moment, as a share of its mean "
                                       "diagonal (larger: closer to the plain gradient)", gt=0)
    # Issue 28: request n anchors to the root, which still knows what requests 1..n-1 erased.
    guard_erasures: bool = param(True, "whiten_updates with an anchor (a run on a later version of a lineage): "
                                       "after every step, undo the update's response on the input directions the "
                                       "erasures between the anchor and the start wrote into each projection, read "
                                       "from the weights (lethe.engine.training.erasure_guard), so that this run "
                                       "cannot bring an earlier erasure back")
    guard_share: float = param(0.25, "guard_erasures: at most this share of each projection's input width is kept "
                                     "off (larger: more of the earlier erasures kept, less room for this one's)",
                               gt=0, le=1)
    max_length: int = param(0, "longest sequence in tokens; longer prompts lose tokens from the left", ge=0,
                            note="0: the model's context length")
    eval_batch_size: int = param(16, "records per forward pass when measuring", ge=1, le=4096)
    seed: int = param(0, "seed of every random choice (batches, splits, counterfactuals)")
    lr: float = param(1e-4, "AdamW learning rate", gt=0, le=1)
    weight_decay: float = param(0.0, "AdamW weight decay", ge=0)
    # Memory (lethe.engine.model.precision, lethe.engine.model.checkpointing, lethe.engine.contract.memory_plan).
    dtype: str = param("auto", "precision of the model in training: with LoRA the frozen base is held in it, the "
                               "adapters and their optimiser state in float32, forward passes under autocast; in full "
                               "fine-tuning the trained "
                               "weights and optimiser state stay float32, forward passes run in it (mixed precision) "
                               "and the frozen copy is held in it; \"auto\": bfloat16 on a GPU (float16 where it "
                               "lacks bfloat16), float32 on CPU", choices=("auto", "float32", "bfloat16", "float16"))
    gradient_checkpointing: bool = param(False, "recompute each decoder block's activations in the backward pass "
                                                "instead of keeping them: less memory, about a third more compute")

    def need(self, ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise EngineInputError(f"parameter {name}={getattr(self, name)!r}: {rule}", field=name)

    def validate(self) -> None:
        """Every field's declared rule, then the rules that tie fields together (check)."""
        check_rules(self, self.need)
        self.check()

    def check(self) -> None:
        """The rules that tie several fields together (the class's own; none here but lora_targets')."""
        self.need(self.lora_targets == "auto" or (len(self.lora_targets) > 0 and "auto" not in self.lora_targets),
                  "lora_targets", "must be \"auto\" or name at least one module")
        self.need(not self.whiten_updates or self.lora is not True, "whiten_updates",
                  "needs lora false: it shapes full fine-tuning's updates of the projections")

    @property
    def adapters(self) -> bool:
        """lora once decided: "auto" is settled where the model and the device are known (training.update_space)."""
        if not isinstance(self.lora, bool):
            raise ValueError(f"lora is still {self.lora!r}: decide it first (training.update_space)")
        return self.lora

    def margin(self) -> dict[str, float]:
        """The restricted margin (k, rho, eta, beta) that measures V for a run with these parameters."""
        raise NotImplementedError

    def resolved(self) -> SharedParams:
        """The parameters a run uses, every "auto" that the method's own fields decide taken in this one step
        (run_unlearning calls it once; the objective and the stop policy receive what it returns). What depends on
        the model or the device is decided where it is measured and reported there in the result: lora_targets by
        the architecture (model.lora_targets), dtype by the device (model.precision), MASC's alpha and record
        ceilings on theta_0 (methods.masc.calibration)."""
        return self

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


P = TypeVar("P")


def build(cls: type[P], values: dict, what: str = "parameter", **internal_values: Any) -> P:
    """An instance of the parameter dataclass `cls` from JSON or CLI values, coerced and validated; an unknown
    name raises, naming it (`what`: how the error calls a parameter). `internal_values`: the fields the engine
    sets (the method)."""
    known = {f.name: f for f in user_fields(cls)}
    for name in values:
        if name not in known:
            raise EngineInputError(f"unknown {what} {name!r}", field=name)
    params = cls(**{name: coerce(known[name], value) for name, value in values.items()}, **internal_values)
    params.validate()  # type: ignore[attr-defined]
    return params


def parse_params(cls: type[P], method: str, values: dict | None, preset: str | None = None,
                 presets: dict[str, dict] | None = None, defaults: dict | None = None) -> P:
    """A method's parameters from a request: its published defaults, then the preset's values, then the
    explicit ones; unknown names, presets and bad values raise, naming them."""
    values = dict(values or {})
    if preset is not None:
        if not presets:
            raise EngineInputError(f"method {method} has no presets: it takes its published defaults",
                                   field="preset")
        if preset not in presets:
            raise EngineInputError(f"unknown preset {preset!r}; known presets: {', '.join(sorted(presets))}",
                                   field="preset")
    if "method" in values:
        raise EngineInputError("unknown parameter 'method': the method is named outside params", field="method")
    merged = {**(defaults or {}), **((presets or {}).get(preset or "") or {}), **values}
    try:
        return build(cls, merged, method=method)
    except EngineInputError as exc:
        if str(exc).startswith("unknown parameter"):
            raise EngineInputError(f"{exc} for method {method}", field=exc.field) from None
        raise


def trusted(cls: type[P], stored: dict) -> P:
    """Parameters as `as_dict` stored them after `build` checked them: rebuilt as they are, not checked again."""
    return cls(**stored)


def _number(value: float | str, name: str) -> float:
    if isinstance(value, str):
        raise ValueError(f"{name} is still {value!r}: resolve the parameters first (params.resolved())")
    return value


def json_type(f: dataclasses.Field) -> tuple[str, bool]:
    """The field's JSON kind ("integer", "number", "boolean", "string", "array") and whether "auto" is allowed."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    auto = "|" in kind
    base = kind.split("|")[0].strip()
    return {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}.get(
        base, "array" if base.startswith("list") else "string"), auto


def coerce(spec: dataclasses.Field, value: Any) -> Any:
    """Accept JSON/CLI values of the right kind; refuse the rest with the parameter's name."""
    kind, auto = json_type(spec)
    if auto and (value == "auto" or value == ["auto"]):
        return "auto"
    choices = (rule_of(spec) or Rule()).choices
    if choices is not None and value in choices and isinstance(value, str):
        return value  # a string choice (such as "auto") in a field whose kind is bool
    try:
        if kind == "boolean":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            raise ValueError
        if kind == "integer":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            if isinstance(value, str) and len(value) > 12:
                raise ValueError
            out = int(value)
            if abs(out) > MAX_INT:
                raise EngineInputError(f"parameter {spec.name}={value!r}: must lie within +-{MAX_INT}",
                                       field=spec.name)
            return out
        if kind == "number":
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            if abs(number) > MAX_FLOAT:
                raise EngineInputError(f"parameter {spec.name}={value!r}: must lie within +-{MAX_FLOAT:g}",
                                       field=spec.name)
            return number
        if kind == "string":
            if not isinstance(value, str):
                raise ValueError
            return value
        if kind == "array":
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return list(value)
    except (TypeError, ValueError):
        short = {"integer": "int", "number": "float", "boolean": "bool", "string": "str", "array": "list"}[kind]
        raise EngineInputError(f"parameter {spec.name}={value!r}: expected {short}", field=spec.name) from None
    return value


def json_schema(cls: type, defaults: dict | None = None, title: str | None = None) -> dict:
    """The JSON schema of a parameter class (the API's OpenAPI document shows it): kinds, ranges, choices,
    defaults (`defaults` overrides the class's, as a method's published ones do) and help text."""
    properties = {}
    for f in user_fields(cls):
        kind, auto = json_type(f)
        rule = rule_of(f) or Rule()
        schema: dict[str, Any] = {"type": kind}
        if kind == "array":
            schema["items"] = {"type": "string"}
        if rule.choices is not None:
            schema = {"enum": list(rule.choices)}
        for key, bound in (("minimum", rule.ge), ("exclusiveMinimum", rule.gt), ("maximum", rule.le),
                           ("exclusiveMaximum", rule.lt)):
            if bound is not None:
                schema[key] = bound
        if auto and rule.choices is None:
            schema = {"anyOf": [schema, {"const": "auto"}]}
        default = (defaults or {}).get(f.name, f.default)
        properties[f.name] = {**schema, "default": default, "description": help_of(f)}
    return {"type": "object", "title": title or cls.__name__, "additionalProperties": False,
            "properties": properties}
