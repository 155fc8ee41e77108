"""The unlearning loop: train until the online stop rule fires, then merge and hand back the model.

Read top to bottom: prepare data, build the policy, loop (check, step), measure, report.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable

import torch

from worker.engine.bound import exact_reproduction_bound
from worker.engine.errors import EngineInputError
from worker.engine.loading import Policy, autocast, context_length, load_model, resolve_device
from worker.engine.methods import METHODS
from worker.engine.params import MascParams
from worker.engine.records import EncodedRecord, batches, collate, encode_records, normalise_records
from worker.engine.runtime import PeakMemory, library_versions, seed_everything
from worker.engine.stop_rule import OnlineStopRule

ENGINE_VERSION = "1"


@dataclass
class UnlearnOutcome:
    result: dict
    model: object | None  # the merged transformers model; None when cancelled
    tokenizer: object


@dataclass
class Prepared:
    device: torch.device
    memory: PeakMemory
    started: float
    model: object
    tokenizer: object
    forget: list[EncodedRecord]
    retain: list[EncodedRecord]


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
    encode = lambda records, what: encode_records(records, tokenizer, max_length=max_length,  # noqa: E731
                                                  seed=params.seed, what=what)
    return Prepared(dev, memory, started, model, tokenizer, encode(forget, "forget"), encode(retain, "retain"))


def split_validation(forget: list[EncodedRecord], params: MascParams) -> tuple[list, list, dict]:
    """D_val: a seeded holdout of the forget set, or the training forget set when it is too small."""
    n = len(forget)
    n_val = max(params.holdout_min, round(params.holdout_fraction * n))
    if params.val_mode == "holdout" and n - n_val >= params.holdout_min:
        order = list(range(n))
        random.Random(params.seed).shuffle(order)
        val = [forget[i] for i in sorted(order[:n_val])]
        train = [forget[i] for i in sorted(order[n_val:])]
        return train, val, {"mode": "holdout", "n_train": len(train), "n_val": len(val)}
    info = {"mode": "train", "n_train": n, "n_val": n}
    if params.val_mode == "holdout":
        info["reason"] = (f"forget set of {n} records is too small to hold out {n_val} and keep "
                          f"{params.holdout_min} for training; D_val is the training forget set")
    return forget, forget, info


def run_unlearning(model_source: str, forget: list[dict], retain: list[dict] | None = None, *,
                   params: MascParams | None = None, method: str = "masc", device: str | None = None,
                   progress: Callable[[dict], None] | None = None,
                   should_cancel: Callable[[], bool] | None = None) -> UnlearnOutcome:
    if method not in METHODS:
        raise EngineInputError(f"unknown method {method!r}; known: {', '.join(METHODS)}", field="method")
    if method != "masc":  # the baselines run a fixed budget (worker.engine.budget)
        from worker.engine.budget import run_budget
        from worker.engine.params import params_for

        params = params if params is not None and not isinstance(params, MascParams) else params_for(method)
        if params.method != method:
            raise EngineInputError(f"parameters are for {params.method}, not {method}", field="method")
        return run_budget(model_source, forget, retain, params=params, device=device, progress=progress,
                          should_cancel=should_cancel)
    params = params or MascParams()
    params.validate()
    run = prepare(model_source, forget, retain, params, device)
    dev, memory, started, model, tokenizer = run.device, run.memory, run.started, run.model, run.tokenizer
    forget_enc, retain_enc = run.forget, run.retain
    train_set, val_set, val_info = split_validation(forget_enc, params)
    policy = Policy(model, lora=params.lora, r=params.lora_r, alpha=params.lora_alpha,
                    dropout=params.lora_dropout, targets=params.lora_targets)
    algo = METHODS[method](params, policy, tokenizer.pad_token_id)
    optimiser = torch.optim.AdamW(policy.trainable_parameters(), lr=params.lr, weight_decay=params.weight_decay)
    rule = OnlineStopRule(params.alpha, params.check_every, params.hoeffding, params.hoeffding_delta)
    pad = tokenizer.pad_token_id
    rng = random.Random(params.seed)

    def violations(records: list[EncodedRecord]) -> list[tuple[float, int]]:
        out = []
        with autocast(dev):
            for batch in batches(records, params.eval_batch_size, pad):
                v, counts = algo.sequence_violations(batch.to(dev))
                out += zip(v.tolist(), counts.int().tolist())
        return out

    def mean_violation(records):
        per_record = violations(records)
        return sum(v for v, _ in per_record) / len(per_record), len(per_record)

    confirm_set = val_set[:params.confirm_size]
    last_trigger: dict = {}

    def trigger():
        sample = (confirm_set if len(confirm_set) <= params.trigger_size
                  else rng.sample(confirm_set, params.trigger_size))
        last_trigger.update(covers_all=sample is confirm_set, value=mean_violation(sample))
        return last_trigger["value"]

    def confirm():
        # A trigger that already covered the whole confirmation set needs no second pass.
        return last_trigger["value"] if last_trigger["covers_all"] else mean_violation(confirm_set)

    def forget_batches():
        while True:
            order = train_set[:]
            rng.shuffle(order)
            for start in range(0, len(order), params.batch_size):
                yield order[start:start + params.batch_size]

    forget_stream = forget_batches()
    loop_started = time.perf_counter()
    step, check_seconds, loss_trace, stop_reason = 0, 0.0, [], None
    while True:
        if rule.due(step):
            t0 = time.perf_counter()
            stop = rule.check(step, trigger, confirm)
            check_seconds += time.perf_counter() - t0
            if stop:
                stop_reason = "alpha"
                break
        if step >= params.max_steps:
            stop_reason = "max_steps"
            break
        if should_cancel is not None and should_cancel():
            stop_reason = "cancelled"
            break
        forget_batch = collate(next(forget_stream), pad).to(dev)
        retain_batch = (collate(rng.choices(retain_enc, k=len(forget_batch)), pad).to(dev) if retain_enc else None)
        with autocast(dev):
            loss, parts = algo.loss(forget_batch, retain_batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        if params.grad_clip:
            torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), params.grad_clip)
        optimiser.step()
        step += 1
        if not math.isfinite(parts["total"]):
            raise FloatingPointError(f"loss became {parts['total']} at step {step}")
        loss_trace.append({"step": step, **parts})
        if progress is not None:
            progress({"step": step, "max_steps": params.max_steps, "losses": parts,
                      "violation_rate": rule.latest_v, "elapsed": time.perf_counter() - started})
    loop_seconds = time.perf_counter() - loop_started
    if progress is not None and stop_reason != "cancelled":
        # One more report, so that the last V a client sees is the one the stop rule decided on.
        last_losses = {k: v for k, v in (loss_trace[-1] if loss_trace else {}).items() if k != "step"}
        progress({"step": step, "max_steps": params.max_steps, "losses": last_losses,
                  "violation_rate": rule.latest_v, "elapsed": time.perf_counter() - started})

    result = {
        "engine_version": ENGINE_VERSION, "method": method, "model": str(model_source), "device": str(dev),
        "stop_reason": stop_reason, "steps": step, "final_violation_rate": rule.latest_v,
        "v_trace": rule.trace, "loss_trace": loss_trace, "validation": val_info,
        "counts": {"forget": len(forget_enc), "retain": len(retain_enc)},
        "retain_term": "none (no retain records)" if not retain_enc else params.retain_loss,
        "truncated": [{"id": r.id, "dropped_prompt_tokens": r.truncated_tokens}
                      for r in forget_enc + retain_enc if r.truncated_tokens],
        "seed": params.seed, "params": params.as_dict(), "versions": library_versions(),
    }
    merged = None
    if stop_reason != "cancelled":
        per_record = [{"id": r.id, "violation": v, "active_tokens": n}
                      for r, (v, n) in zip(forget_enc, violations(forget_enc))]
        result["bound"] = exact_reproduction_bound(params.rho, params.beta, per_record)
        merged = policy.merged()
    result["timing"] = {"wall_seconds": time.perf_counter() - started, "load_seconds": loop_started - started,
                        "loop_seconds": loop_seconds, "stop_check_seconds": check_seconds}
    result["wall_seconds"] = result["timing"]["wall_seconds"]
    result["peak_memory"] = memory.read()
    return UnlearnOutcome(result=result, model=merged, tokenizer=tokenizer)
