"""What every run starts with: the checked and encoded records, seeds, the device, the model and its tokenizer,
and the trainable model (the model with LoRA adapters, or trained in full) whose parameters the objective trains."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.memory_plan import MemoryPlan
from lethe.engine.contract.parameters import SharedParams
from lethe.engine.data.inputs import RunInputs
from lethe.engine.data.records import EncodedRecord
from lethe.engine.model import sharding
from lethe.engine.model.loading import (
    TrainableModel,
    config_context_length,
    load_config,
    load_tokenizer,
    load_weights,
    resolve_device,
)
from lethe.engine.model.memory_check import DoesNotFit, device_capacity, plan_run
from lethe.engine.model.precision import Precision, resolve_precision, stored_dtype
from lethe.engine.training.runtime import PeakMemory, seed_everything
from lethe.engine.training.update_space import P, decide_update_space

ENGINE_VERSION = "2"


@dataclass
class Prepared:
    device: torch.device
    memory: PeakMemory
    started: float
    model: Any
    tokenizer: Any
    forget: list[EncodedRecord]
    retain: list[EncodedRecord]
    holdout: list[dict]  # records the model never saw, as the model sees them (rendered in chat format)
    max_length: int
    precision: Precision
    saved_dtype: torch.dtype  # the checkpoint's own dtype, which the unlearned one keeps
    memory_plan: MemoryPlan
    params: Any  # the run's parameters with lora decided (update_space): what every later step reads
    anchor: Any = None  # the retain term's fixed reference, loaded frozen (None: pi_0)


def prepare(model_source: str, inputs: RunInputs, params: P, device: str | None, *,
            memory_limit: int | None = None, objective: type | None = None, anchor: str | None = None) -> Prepared:
    """Seeds, the device, the records as the model sees them and their tokens, lora "auto" decided (Prepared.params),
    the memory plan, the model (and the anchor, a version of the same lineage the retain term keeps the model close
    to). A run whose planned peak exceeds `memory_limit` (bytes; None: what the device holds) raises DoesNotFit
    before the weights are loaded."""
    seed_everything(params.seed)
    dev = resolve_device(device)
    memory = PeakMemory(dev)
    started = time.perf_counter()
    config = load_config(model_source)
    saved_dtype = stored_dtype(config)  # read before loading: loading in another dtype rewrites the config
    tokenizer = load_tokenizer(model_source)
    max_length = config_context_length(config, params.max_length)
    # As the model sees them: in its chat template where asked, long documents as windows of its context; tokenised
    # once for the run, its audit and its curves (copies: the objective writes into its records).
    tokens = inputs.tokenised(tokenizer, max_length, params.seed)
    encoded_forget, encoded_retain, holdout = tokens.records("forget"), tokens.records("retain"), tokens.holdout
    capacity = memory_limit if memory_limit is not None else device_capacity(dev)
    anchor = anchor if encoded_retain else None  # no retain term: nothing to anchor
    anchored = anchor is not None
    vocabularies = {getattr(c.get_text_config(), "vocab_size", None) for c in (config, load_config(anchor))} \
        if anchor is not None else set()
    if len(vocabularies) > 1:
        raise EngineInputError("anchor: its vocabulary is not the model's (an anchor is a version of the same "
                               "lineage)", field="anchor")

    plans: dict[tuple, MemoryPlan] = {}  # by parameter space: "auto"'s choice is not planned twice

    def plan_for(chosen: P) -> MemoryPlan:
        key = (chosen.lora, chosen.whiten_updates)
        if key not in plans:
            precision = resolve_precision(chosen.dtype, dev, lora=chosen.adapters)
            plans[key] = plan_run(config, chosen, precision, encoded_forget, encoded_retain, capacity, objective,
                                  anchored)
        return plans[key]

    params = decide_update_space(params, plan_for, has_retain=bool(encoded_retain), sharded=sharding.active())
    precision = resolve_precision(params.dtype, dev, lora=params.adapters)
    plan = plan_for(params)
    device_map = spread_over_gpus(config, plan, precision) if not plan.fits and memory_limit is None else None
    if not plan.fits:
        raise DoesNotFit(plan)
    # Sharded, each process loads on the host and FSDP moves its shard to the device.
    model = load_weights(model_source, torch.device("cpu") if sharding.active() and not params.adapters else dev,
                         precision.load_dtype, device_map)
    if device_map:
        dev = model.get_input_embeddings().weight.device  # batches start where the embeddings are
    anchor_model = None
    if anchor is not None:  # read only: held in the dtype pi_0's frozen copy would have
        anchor_model = load_weights(anchor, dev, precision.reference_dtype if precision.half
                                    else precision.load_dtype).requires_grad_(False)
    return Prepared(dev, memory, started, model, tokenizer, encoded_forget, encoded_retain, holdout, max_length,
                    precision, saved_dtype, plan, params, anchor_model)


def spread_over_gpus(config: Any, plan: MemoryPlan, precision: Precision) -> dict | None:
    """A LoRA job too large for one GPU, on a worker with several: a device map over them when they hold it (the
    plan's capacity becomes theirs together), else None."""
    from lethe.engine.model.device_map import gpu_budgets, on_gpus, plan_device_map, visible_gpus
    from lethe.engine.model.memory_check import meta_model

    gpus = visible_gpus()
    if not precision.lora or precision.device.type != "cuda" or len(gpus) < 2:
        return None
    mapping = plan_device_map(meta_model(config), precision.name, gpu_budgets(plan, gpus))
    if not on_gpus(mapping):
        return None
    plan.capacity_bytes = sum(gpus)
    plan.assumptions.append(f"placed over {len(set(mapping.values()))} GPUs by a device map")
    return mapping


def build_trainable_model(model: Any, params: SharedParams, objective: type,
                          precision: Precision | None = None) -> TrainableModel:
    """LoRA on the usual targets (or full fine-tuning), unless the objective names the modules it trains
    (`trainable_modules`, RMU's MLP output projections): then LoRA on those, or full training of those alone.
    Full mode in half precision holds pi_0's frozen copy in it; gradient checkpointing wraps the blocks."""
    chooser = getattr(objective, "trainable_modules", None)
    targets = params.lora_targets if chooser is None else chooser(model, params)
    reference_dtype = precision.reference_dtype if precision is not None and precision.half else None
    if params.adapters:
        trainable = TrainableModel(model, lora=True, r=params.lora_r, alpha=params.lora_alpha,
                                   dropout=params.lora_dropout, targets=targets)
    else:
        trainable = TrainableModel(model, lora=False, reference_dtype=reference_dtype)
        if chooser is not None:
            trainable.restrict_training(list(targets))
        if sharding.active():
            trainable.shard(precision.device if precision is not None else torch.device("cpu"))
    if params.gradient_checkpointing:
        trainable.checkpoint_activations()
    return trainable
