"""The unlearning methods, one registration each (in the spirit of peft's register_peft_method): a name, a
parameter class whose fields carry their help text and ranges, the method's published defaults and presets, its
objective and its stop policy. The objective is a torch module named by its path and imported only when a run
starts, so that the API, which checks requests against this registry, stays torch-free. Everything that lists
methods (the API's enum and schema, the CLI's flags, the benchmarks) reads METHODS.

An objective is what `Objective` describes (and optionally `trainable_modules(model, params) -> list[str]`: the
modules it trains, where not LoRA's usual targets; see rmu.RMU)."""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.parameters import SharedParams, json_schema, parse_params, trusted
from lethe.engine.methods.baseline_params import BaselineParams
from lethe.engine.methods.masc.params import PRESETS, MascParams

if TYPE_CHECKING:  # the registry stays torch-free at run time (the API imports it)
    import torch

    from lethe.engine.data.records import Batch
    from lethe.engine.model.loading import TrainableModel


class Objective(Protocol):
    """What a method's objective is: built once per run on the trainable model and the resolved parameters, it
    gives the loss of one (forget, retain) micro-batch and its parts as plain numbers for the trace."""
    trainable: TrainableModel

    def __init__(self, params: Any, trainable: TrainableModel, pad_id: int) -> None: ...

    def loss(self, forget: Batch | None, retain: Batch | None) -> tuple[torch.Tensor, dict[str, float]]: ...


# "online-rule": train until MASC's stop rule fires (lethe.engine.methods.masc.stop_policy); "fixed-budget": the field's
# epochs and schedule (lethe.engine.training.budget).
StopKind = Literal["online-rule", "fixed-budget"]


@dataclass(frozen=True)
class Method:
    """One registered method: what the API, the CLI, the benchmarks and a run need to know of it."""
    name: str
    summary: str
    params: type[SharedParams]
    objective: str  # "module:Class"
    stop: StopKind
    defaults: Mapping[str, Any] = field(default_factory=dict)  # published values over the class's defaults
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def parse(self, values: dict | None = None, preset: str | None = None) -> SharedParams:
        """Checked parameters from a request or flags: defaults, preset, explicit values."""
        return parse_params(self.params, self.name, values, preset, {k: dict(v) for k, v in self.presets.items()},
                            dict(self.defaults))

    def stored(self, values: dict) -> SharedParams:
        """Parameters that `parse` checked and `as_dict` stored, trusted as they are."""
        return trusted(self.params, values)

    def objective_class(self) -> type[Objective]:
        """The objective's class, imported now (torch)."""
        module, name = self.objective.split(":")
        objective: type[Objective] = getattr(importlib.import_module(module), name)
        return objective

    def schema(self) -> dict:
        """The JSON schema of the method's parameters, with its defaults, as the API's OpenAPI document shows it."""
        return {**json_schema(self.params, dict(self.defaults), title=f"{self.name} parameters"),
                "description": self.summary}


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add a method to the registry (its name must be new)."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is registered twice")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """A registered method by name; an unknown one is refused, naming the known ones."""
    if name not in METHODS:
        raise EngineInputError(f"unknown method {name!r}; known: {', '.join(METHODS)}", field="method")
    return METHODS[name]


def params_for(method: str, values: dict | None = None, preset: str | None = None) -> SharedParams:
    """The checked parameters of any method by name."""
    return get_method(method).parse(values, preset)


def all_presets() -> list[str]:
    """Every preset name of every method."""
    return sorted({p for m in METHODS.values() for p in m.presets})


register_method(Method(
    "masc", "MASC: margin self-correction until its online stop rule fires (SPEC section 3)", MascParams,
    "lethe.engine.methods.masc.objective:Masc", "online-rule", presets=PRESETS))
register_method(Method(
    "ga", "gradient ascent: minimise -NLL of the forget answers", BaselineParams,
    "lethe.engine.methods.ga:GradientAscent", "fixed-budget"))
register_method(Method(
    "graddiff", "GradDiff: -gamma NLL_forget + alpha NLL_retain", BaselineParams,
    "lethe.engine.methods.graddiff:GradDiff", "fixed-budget", defaults={"forget_weight": 1.0, "retain_weight": 1.0}))
register_method(Method(
    "npo", "NPO against theta_0, plus retain NLL", BaselineParams, "lethe.engine.methods.npo:NPO",
    "fixed-budget", defaults={"beta": 0.1, "retain_weight": 1.0}))
register_method(Method(
    "npo_kl", "NPO against theta_0, plus KL(theta_0 || theta) on retain tokens", BaselineParams,
    "lethe.engine.methods.npo:NPOKL", "fixed-budget", defaults={"beta": 0.1, "retain_weight": 1.0}))
register_method(Method(
    "simnpo", "SimNPO: length-normalised NPO without a reference, plus retain NLL", BaselineParams,
    "lethe.engine.methods.simnpo:SimNPO", "fixed-budget",
    defaults={"beta": 4.5, "delta": 0.0, "forget_weight": 0.125, "retain_weight": 1.0}))
register_method(Method(
    "rmu", "RMU: steer forget hidden states at one layer to a random vector, keep retain ones", BaselineParams,
    "lethe.engine.methods.rmu:RMU", "fixed-budget", defaults={"retain_weight": 100.0}))
