"""The fixed-budget loop of the baselines (SPEC section 4): epochs over the forget set, each forget
example paired with a random retain example, AdamW, a linear schedule with a warm-up epoch, micro-batches
accumulated to the effective batch. No stop rule: the budget is the point of comparison. At the end the
violation rate is measured with MASC's default margin, so every method reports the same statistic."""
from __future__ import annotations

import math
import random
import time

import torch

from worker.engine.bound import exact_reproduction_bound
from worker.engine.loading import Policy, autocast
from worker.engine.methods import METHODS
from worker.engine.methods.masc import Masc
from worker.engine.methods.rmu import trainable_modules
from worker.engine.params import MascParams
from worker.engine.records import collate
from worker.engine.run_setup import ENGINE_VERSION, UnlearnOutcome, prepare
from worker.engine.runtime import library_versions


def build_policy(model, params) -> Policy:
    if params.method != "rmu":
        return Policy(model, lora=params.lora, r=params.lora_r, alpha=params.lora_alpha,
                      dropout=params.lora_dropout, targets=params.lora_targets)
    targets = trainable_modules(model, params)
    if params.lora:
        return Policy(model, lora=True, r=params.lora_r, alpha=params.lora_alpha, dropout=params.lora_dropout,
                      targets=targets)
    policy = Policy(model, lora=False)
    policy.restrict_training(targets)
    return policy


def schedule(warmup_steps: int, total_steps: int):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return factor


def run_budget(model_source: str, forget: list[dict], retain: list[dict] | None, *, params, device=None,
               progress=None, should_cancel=None):
    run = prepare(model_source, forget, retain, params, device)
    dev, memory, started, tokenizer = run.device, run.memory, run.started, run.tokenizer
    forget_enc, retain_enc = run.forget, run.retain
    policy = build_policy(run.model, params)
    pad = tokenizer.pad_token_id
    algo = METHODS[params.method](params, policy, pad)
    optimiser = torch.optim.AdamW(policy.trainable_parameters(), lr=params.lr, weight_decay=params.weight_decay)
    accumulate = max(1, params.effective_batch // params.batch_size)
    micro_per_epoch = math.ceil(len(forget_enc) / params.batch_size)
    total_micro = math.ceil(params.epochs * micro_per_epoch)
    total_steps = math.ceil(total_micro / accumulate)
    warmup = round(params.warmup_epochs * micro_per_epoch / accumulate)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, schedule(warmup, total_steps))
    rng = random.Random(params.seed)

    def micro_batches():
        while True:
            order = forget_enc[:]
            rng.shuffle(order)
            for start in range(0, len(order), params.batch_size):
                yield order[start:start + params.batch_size]

    stream, step, loss_trace, stop_reason = micro_batches(), 0, [], "budget"
    loop_started = time.perf_counter()
    for micro in range(total_micro):
        if should_cancel is not None and should_cancel():
            stop_reason = "cancelled"
            break
        forget_batch = collate(next(stream), pad).to(dev)
        retain_batch = collate(rng.choices(retain_enc, k=len(forget_batch)), pad).to(dev) if retain_enc else None
        with autocast(dev):
            loss, parts = algo.loss(forget_batch, retain_batch)
        (loss / accumulate).backward()
        if (micro + 1) % accumulate and micro + 1 != total_micro:
            continue
        if params.grad_clip:
            torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), params.grad_clip)
        optimiser.step()
        lr_schedule.step()
        optimiser.zero_grad(set_to_none=True)
        step += 1
        if not math.isfinite(parts["total"]):
            raise FloatingPointError(f"loss became {parts['total']} at step {step}")
        loss_trace.append({"step": step, **parts})
        if progress is not None:
            progress({"step": step, "max_steps": total_steps, "losses": parts, "violation_rate": None,
                      "elapsed": time.perf_counter() - started})
    loop_seconds = time.perf_counter() - loop_started

    margin_params = MascParams()  # the common yardstick: k 10, rho 0.5, beta 1
    yardstick = Masc(margin_params, policy, pad)
    result = {
        "engine_version": ENGINE_VERSION, "method": params.method, "model": str(model_source), "device": str(dev),
        "stop_reason": stop_reason, "steps": step, "budget_steps": total_steps, "v_trace": [],
        "loss_trace": loss_trace, "validation": {"mode": "none (fixed budget)"},
        "counts": {"forget": len(forget_enc), "retain": len(retain_enc)},
        "seed": params.seed, "params": params.as_dict(), "versions": library_versions(),
        "truncated": [{"id": r.id, "dropped_prompt_tokens": r.truncated_tokens}
                      for r in forget_enc + retain_enc if r.truncated_tokens],
    }
    merged = None
    if stop_reason != "cancelled":
        checks = yardstick.check_records(forget_enc, params.eval_batch_size)
        per_record = [{"id": c.id, "violation": c.violation, "active_tokens": c.active_tokens,
                       "reproduced": c.reproduced} for c in checks]
        result["final_violation_rate"] = sum(c.violation for c in checks) / len(checks)
        result["per_record"] = per_record
        result["violation_yardstick"] = {"k": margin_params.k, "rho": margin_params.rho, "beta": margin_params.beta}
        result["bound"] = exact_reproduction_bound(margin_params.rho, margin_params.beta, per_record)
        merged = policy.merged()
    else:
        result["final_violation_rate"] = None
    result["timing"] = {"wall_seconds": time.perf_counter() - started, "load_seconds": loop_started - started,
                        "loop_seconds": loop_seconds, "stop_check_seconds": 0.0}
    result["wall_seconds"] = result["timing"]["wall_seconds"]
    result["peak_memory"] = memory.read()
    return UnlearnOutcome(result=result, model=merged, tokenizer=tokenizer)
