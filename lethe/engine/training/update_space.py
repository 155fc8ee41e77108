"""What a run trains when `lora` is "auto" (MASC's choice of parameter space, issue 28): full fine-tuning with whitened
updates where it can run, LoRA where it cannot. Whitened full fine-tuning wore a quarter of LoRA's margin per unit of
erasure on the knowledge no retain term holds, but it needs retain records (its second moments are measured on them),
one process (FSDP shards the weights it whitens) and room for float32 weights, AdamW's moments, a frozen copy and the
inverses; LoRA needs little more than the model. Decided once, before the weights load, and reported in the result's
parameters, as dtype "auto" is."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from lethe.engine.contract.memory_plan import MemoryPlan
from lethe.engine.contract.parameters import SharedParams

P = TypeVar("P", bound=SharedParams)


def decide_update_space(params: P, plan_for: Callable[[P], MemoryPlan], *, has_retain: bool, sharded: bool) -> P:
    """`params` with lora true or false: as given, or for "auto" full fine-tuning whitened (whiten_updates true) when
    the run has retain records, is not sharded and `plan_for` (the memory plan of a choice) says it fits, else LoRA.
    whiten_updates asked for by name with lora "auto" means full fine-tuning, fit or not (the plan then refuses)."""
    if params.lora != "auto":
        return params
    whitened = dataclasses.replace(params, lora=False, whiten_updates=True)
    if params.whiten_updates or (has_retain and not sharded and plan_for(whitened).fits):
        return whitened
    return dataclasses.replace(params, lora=True)
