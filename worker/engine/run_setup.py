"""What every method's run starts with and ends with: the engine's version, the checked and encoded records,
the device and model (worker.engine.unlearn for MASC, worker.engine.budget for the baselines)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from worker.engine.loading import context_length, load_model, resolve_device
from worker.engine.records import EncodedRecord, encode_records, normalise_records
from worker.engine.runtime import PeakMemory, seed_everything

ENGINE_VERSION = "2"


@dataclass
class UnlearnOutcome:
    result: dict
    model: object | None  # the merged transformers model; None when cancelled
    tokenizer: Any


@dataclass
class Prepared:
    device: torch.device
    memory: PeakMemory
    started: float
    model: object
    tokenizer: Any
    forget: list[EncodedRecord]
    retain: list[EncodedRecord]
    max_length: int


def prepare(model_source: str, forget: list[dict], retain: list[dict] | None, params, device) -> Prepared:
    """What every method's run starts with: checked records, seeds, the device, the model, tokens."""
    forget = normalise_records(forget, "forget")
    retain = normalise_records(retain or [], "retain", allow_empty=True)
    seed_everything(params.seed)
    dev = resolve_device(device)
    memory = PeakMemory(dev)
    started = time.perf_counter()
    model, tokenizer = load_model(model_source, dev)
    max_length = context_length(model, tokenizer, params.max_length)

    def encode(records, what):
        return encode_records(records, tokenizer, max_length=max_length, seed=params.seed, what=what)

    return Prepared(dev, memory, started, model, tokenizer, encode(forget, "forget"), encode(retain, "retain"),
                    max_length)
