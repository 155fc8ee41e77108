"""What every run starts with: the checked and encoded records, seeds, the device, the model and its tokenizer,
and the policy (the model with LoRA adapters, or trained in full) whose parameters the objective trains."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from worker.engine.chat import check_format, render
from worker.engine.documents import split_documents
from worker.engine.loading import Policy, context_length, load_model, resolve_device
from worker.engine.param_base import SharedParams
from worker.engine.records import EncodedRecord, encode_records, normalise_records
from worker.engine.runtime import PeakMemory, seed_everything

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


def prepare(model_source: str, forget: list[dict], retain: list[dict] | None, params: SharedParams,
            device: str | None, *, holdout: list[dict] | None = None, format: str = "plain") -> Prepared:
    """Checked records, seeds, the device, the model, tokens; `format` "chat" renders the records with the
    tokenizer's chat template (worker.engine.chat)."""
    check_format(format)
    forget = normalise_records(forget, "forget")
    retain = normalise_records(retain or [], "retain", allow_empty=True)
    holdout = normalise_records(holdout or [], "holdout", allow_empty=True)
    seed_everything(params.seed)
    dev = resolve_device(device)
    memory = PeakMemory(dev)
    started = time.perf_counter()
    model, tokenizer = load_model(model_source, dev)
    max_length = context_length(model, tokenizer, params.max_length)
    # As the model sees them: in its chat template where asked, long documents as windows of its context.
    forget, retain, holdout = (split_documents(render(records, tokenizer, format, what), tokenizer, max_length, what)
                               for records, what in ((forget, "forget"), (retain, "retain"), (holdout, "holdout")))

    def encode(records: list[dict], what: str) -> list[EncodedRecord]:
        return encode_records(records, tokenizer, max_length=max_length, seed=params.seed, what=what)

    return Prepared(dev, memory, started, model, tokenizer, encode(forget, "forget"), encode(retain, "retain"),
                    holdout, max_length)


def build_policy(model: Any, params: SharedParams, objective: type) -> Policy:
    """LoRA on the usual targets (or full fine-tuning), unless the objective names the modules it trains
    (`trainable_modules`, RMU's MLP output projections): then LoRA on those, or full training of those alone."""
    chooser = getattr(objective, "trainable_modules", None)
    if chooser is None:
        return Policy(model, lora=params.lora, r=params.lora_r, alpha=params.lora_alpha,
                      dropout=params.lora_dropout, targets=params.lora_targets)
    targets = chooser(model, params)
    if params.lora:
        return Policy(model, lora=True, r=params.lora_r, alpha=params.lora_alpha, dropout=params.lora_dropout,
                      targets=targets)
    policy = Policy(model, lora=False)
    policy.restrict_training(targets)
    return policy
