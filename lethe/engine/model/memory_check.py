"""The memory plan of a run, on the engine's side: the model built on the meta device (its exact parameters and
LoRA's adapters for the job's targets, no memory taken), the records' real token counts, and the device's
memory; a run that would not fit fails here, before its weights are loaded (contract.memory_plan has the formula)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.memory_plan import MemoryPlan, ModelShape, Workload, estimate, shape_from_config
from lethe.engine.contract.parameters import SharedParams
from lethe.engine.data.records import EncodedRecord
from lethe.engine.methods.masc.answers import ANSWER_SLACK
from lethe.engine.model.precision import Precision


class DoesNotFit(EngineInputError):
    """The job's estimated peak is more than its device holds: refused before anything is loaded."""

    def __init__(self, plan: MemoryPlan):
        super().__init__(f"does not fit: {plan.explain()}; try dtype \"bfloat16\", LoRA, gradient_checkpointing, "
                         "a smaller batch_size or max_length, or a worker with more memory", field="params")
        self.plan = plan


def device_capacity(device: torch.device) -> int | None:
    """Bytes the device holds: a GPU's total memory; on CPU what the system has available now."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def meta_model(config):
    """The architecture with no memory behind its tensors."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def model_shape(config, params: SharedParams, objective: type | None = None) -> ModelShape:
    """Parameters counted on the meta model (shared tensors once), adapters as LoRA would place them."""
    from lethe.engine.model.loading import lora_modules

    model = meta_model(config)
    parameters = sum(p.numel() for p in model.parameters())
    chooser = getattr(objective, "trainable_modules", None)
    targets = params.lora_targets if chooser is None else chooser(model, params)
    adapters, trainable = 0, None
    modules = dict(model.named_modules())
    if params.adapters:
        for name in lora_modules(model, targets):
            weight = modules[name].weight
            adapters += params.lora_r * (weight.shape[0] + weight.shape[1])
    elif chooser is not None:
        trainable = sum(p.numel() for n, p in model.named_parameters()
                        if any(n.rsplit(".", 1)[0].endswith(t) for t in targets))
    return shape_from_config(config.to_dict(), parameters, adapters, trainable)


def plan_run(config, params: SharedParams, precision: Precision, forget: list[EncodedRecord],
             retain: list[EncodedRecord], capacity: int | None, objective: type | None = None,
             anchored: bool = False) -> MemoryPlan:
    longest = max(len(r.input_ids) for r in [*forget, *retain])
    retain_rows = (getattr(params, "retain_batch_size", 0) or params.batch_size) if retain else 0
    forget_rows = params.batch_size
    if getattr(params, "content", False):  # the model's own answers ride along: as many rows, 16 tokens longer
        forget_rows, longest = 2 * params.batch_size, longest + ANSWER_SLACK
    from lethe.engine.model import sharding

    shards = torch.distributed.get_world_size() if sharding.active() and not params.adapters else 1
    work = Workload(dtype=precision.name, lora=precision.lora, train_rows=forget_rows + retain_rows,
                    eval_rows=params.eval_batch_size, max_tokens=longest,
                    gradient_checkpointing=params.gradient_checkpointing, shards=shards, anchored=anchored,
                    whitened=params.whiten_updates, guarded=anchored and params.guard_erasures,
                    guard_share=params.guard_share)
    return estimate(model_shape(config, params, objective), work, capacity)
