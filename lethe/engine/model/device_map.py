"""A LoRA job on a model larger than one GPU: its blocks placed over the worker's GPUs (transformers' device_map,
planned by accelerate on the meta device: no memory taken), activations handed from one GPU to the next. Each GPU's
budget is what the memory plan allows a device, less the job's transient memory (which any of them may hold)."""
from __future__ import annotations

import torch

from lethe.engine.contract.memory_plan import HEADROOM, MemoryPlan
from lethe.engine.model.precision import DTYPES


def plan_device_map(model_on_meta, dtype: str, budgets: dict[int, int]) -> dict[str, int | str]:
    """Module name -> GPU index; "cpu" or "disk" in it means the GPUs cannot hold the model."""
    from accelerate import infer_auto_device_map

    no_split = getattr(model_on_meta, "_no_split_modules", None) or []
    return infer_auto_device_map(model_on_meta, max_memory=dict(budgets), no_split_module_classes=list(no_split),
                                 dtype=DTYPES[dtype])


def on_gpus(device_map: dict) -> bool:
    return all(isinstance(place, int) for place in device_map.values())


def gpu_budgets(plan: MemoryPlan, capacities: list[int]) -> dict[int, int]:
    """Bytes of weights each GPU may take: its share under the headroom, less the job's transient memory and
    LoRA's adapters (they sit beside the modules they adapt, anywhere)."""
    transient = max(plan.parts.get("training_step", 0), plan.parts.get("measurement", 0))
    adapters = plan.parts.get("adapters_and_optimiser", 0)
    return {i: max(0, int(c / HEADROOM) - transient - adapters) for i, c in enumerate(capacities)}


def visible_gpus() -> list[int]:
    """Each visible GPU's total memory."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
