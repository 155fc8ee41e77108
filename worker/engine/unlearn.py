"""The unlearning loop: train until the online stop rule fires, then merge and hand back the model.

Read top to bottom: prepare data, build the policy, calibrate the rule's targets on theta_0, loop
(check, step on the records the rule still finds dominant), measure, report.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from worker.engine.baseline_params import BaselineParams
from worker.engine.bound import exact_reproduction_bound
from worker.engine.budget import run_budget
from worker.engine.calibration import calibrate
from worker.engine.counterfactual import shared_template
from worker.engine.errors import EngineInputError
from worker.engine.extraction import own_answers, request_secrets, secret_priors, secret_sources
from worker.engine.loading import Policy, autocast
from worker.engine.methods import METHODS
from worker.engine.methods.masc import Masc, checks_of
from worker.engine.neighbours import RetainSampler, nearest, neighbour_scores
from worker.engine.params import MascParams, params_for
from worker.engine.records import EncodedRecord, collate, encode_record, normalise_records
from worker.engine.run_setup import ENGINE_VERSION, UnlearnOutcome, prepare
from worker.engine.runtime import library_versions
from worker.engine.schedule import Escalation, ForgetStream
from worker.engine.secret_spans import named_secrets, secret_focus
from worker.engine.stop_rule import (
    ErasureCondition,
    OnlineStopRule,
    RecordCheck,
    RecordStates,
    mean_violation,
)

CONDITION = ("stop when V = mean_i v_i <= alpha and, for every forget record i, v_i <= c_i (its ceiling) and "
             "greedy decoding does not reproduce it (some active token is not the argmax)")
SECRET_CONDITION = ("stop when, for every forget record i, greedy decoding does not reproduce it; where its secrets "
                    "are located, no secret is said whole with probability above its limit, none is greedy-decoded "
                    "given the text before it, and the model's own greedy answer gives none back (these replace "
                    "its ceiling and its share in the mean); elsewhere v_i <= c_i, and V = the mean of v_i over "
                    "those records <= alpha")


def split_validation(forget: list[EncodedRecord], params: MascParams) -> tuple[list, list, dict]:
    """D_val: every forget record (train mode, the default), or a seeded holdout kept out of training."""
    n = len(forget)
    if params.val_mode == "train":
        return forget, forget, {"mode": "train", "n_train": n, "n_val": n}
    n_val = max(params.holdout_min, round(params.holdout_fraction * n))
    if n - n_val >= params.holdout_min:
        order = list(range(n))
        random.Random(params.seed).shuffle(order)
        val = [forget[i] for i in sorted(order[:n_val])]
        train = [forget[i] for i in sorted(order[n_val:])]
        return train, val, {"mode": "holdout", "n_train": len(train), "n_val": len(val),
                            "never_trained": [r.id for r in val]}
    return forget, forget, {"mode": "train", "n_train": n, "n_val": n,
                            "reason": f"forget set of {n} records is too small to hold out {n_val} and keep "
                                      f"{params.holdout_min} for training; D_val is the training forget set"}


def run_unlearning(model_source: str, forget: list[dict], retain: list[dict] | None = None, *,
                   holdout: list[dict] | None = None, params: MascParams | BaselineParams | None = None,
                   method: str = "masc",
                   device: str | None = None, progress: Callable[[dict], None] | None = None,
                   should_cancel: Callable[[], bool] | None = None) -> UnlearnOutcome:
    if method not in METHODS:
        raise EngineInputError(f"unknown method {method!r}; known: {', '.join(METHODS)}", field="method")
    if method != "masc":  # the baselines run a fixed budget (worker.engine.budget)
        baseline = params if params is not None and not isinstance(params, MascParams) else params_for(method)
        if isinstance(baseline, MascParams) or baseline.method != method:
            raise EngineInputError(f"parameters are for {getattr(baseline, 'method', 'masc')}, not {method}",
                                   field="method")
        return run_budget(model_source, forget, retain, params=baseline, device=device, progress=progress,
                          should_cancel=should_cancel)
    if params is not None and not isinstance(params, MascParams):
        raise EngineInputError(f"parameters are for {params.method}, not masc", field="method")
    params = params or MascParams()
    params.validate()
    holdout = normalise_records(holdout or [], "holdout", allow_empty=True)
    run = prepare(model_source, forget, retain, params, device)
    dev, memory, started, tokenizer = run.device, run.memory, run.started, run.tokenizer
    forget_enc, retain_enc = run.forget, run.retain
    forget_sources, retain_sources = [r.source for r in forget_enc], [r.source for r in retain_enc]
    template = shared_template(forget_sources, retain_sources)
    secrets = request_secrets(forget_sources, retain_sources, template)
    # "auto" focuses on the secrets a request names, and suppresses the other records whole (see params).
    focus_ids = ({r.id for r in forget_enc} if params.secret_focus is True else
                 {r.id for r in forget_enc if named_secrets(r.source)} if params.secret_focus == "auto" else set())
    requested_focus, params = params.secret_focus, params.resolved(bool(focus_ids))
    for record in forget_enc:  # which tokens of each record are its secret, and which the template around it
        if record.id in focus_ids:
            record.focus = secret_focus(record, secrets[record.id], tokenizer, template)
    train_set, val_set, val_info = split_validation(forget_enc, params)
    policy = Policy(run.model, lora=params.lora, r=params.lora_r, alpha=params.lora_alpha,
                    dropout=params.lora_dropout, targets=params.lora_targets)
    algo = Masc(params, policy, tokenizer.pad_token_id)
    pad, rng = tokenizer.pad_token_id, random.Random(params.seed)

    def measure(records: list[EncodedRecord]) -> list[RecordCheck]:
        return algo.check_records(records, params.eval_batch_size)

    # theta_0 (no step taken yet): the rule's targets, and every record's starting state.
    t0 = time.perf_counter()
    # A record whose secret is suppressed and whose template stays as theta_0 has it shows v_i = the template's
    # share of its tokens, as a model that never saw it would: that share is a floor under its ceiling.
    floors = {r.id: 1 - r.secret_tokens / r.active_tokens for r in forget_enc if r.focus is not None}
    located = frozenset(r.id for r in forget_enc if r.focus is not None and r.secret_tokens)
    calibration = calibrate(params.alpha, params.record_ceiling, forget_sources, retain_sources, holdout, params.seed,
                            lambda records: [c.violation for c in measure(_encodable(records, tokenizer, run.max_length,
                                                                                      params.seed))], floors,
                            {r.id for r in forget_enc} - located if located else None)
    latest = RecordStates(measure(forget_enc))
    initial_v = latest.mean()
    calibration_seconds = time.perf_counter() - t0
    train_mode = val_info["mode"] == "train"
    erasure = ErasureCondition(calibration.ceilings, params.secret_max_probability, located,
                               secret_priors(secrets, retain_sources, forget_sources, template))
    condition = erasure if train_mode else None
    rule = OnlineStopRule(calibration.alpha, params.check_every, params.hoeffding, params.hoeffding_delta, condition)
    confirm_set = val_set[:params.confirm_size] if params.confirm_size else val_set

    by_record = {r.id: r for r in forget_enc}

    judged_mean: float | None = None  # the mean the rule judges, refreshed once per step (read by is_open)

    def is_open(rid: str) -> bool:
        """Still to be trained: the record fails its own condition, or it counts in the rule's mean, the
        mean fails, and it lies above it (a record with located secrets is decided by them alone: once
        they are suppressed its template stays, as in any model; suppressing that too only buys loops)."""
        if not train_mode:
            return True
        check = latest[rid]
        if not erasure.holds(check):
            return True
        target = rule.mean_target(max(1, len(confirm_set) - len(located)))
        return rid not in located and judged_mean is not None and judged_mean > target and check.violation > target

    def trigger() -> list[RecordCheck]:
        if train_mode:  # the latest state of every record, kept current by the training passes: free
            return latest.all()
        sample = confirm_set if len(confirm_set) <= params.trigger_size else rng.sample(confirm_set,
                                                                                        params.trigger_size)
        return measure(sample)

    replay: dict[str, EncodedRecord] = {}  # the model's latest own answer to each forget prompt

    def answer(records: list[EncodedRecord]) -> set[str]:
        """Refresh the model's own answers to these prompts; the ids of those that give a secret back. Only
        the answers of records with located secrets are trained on: a record suppressed whole would have its
        own answer held at theta_0 by the fluency term, against its own suppression (it stayed reproduced for
        400 steps on the test fixture)."""
        fresh = own_answers(policy.model, tokenizer, records, secrets, run.max_length, template)
        replay.update({rid: example for rid, (example, _) in fresh.items() if rid in located})
        return {rid for rid, (_, leaked) in fresh.items() if leaked}

    def confirm() -> list[RecordCheck]:
        checks = measure(confirm_set)
        if train_mode:
            if params.secret_focus:  # the model's own greedy answers, where nothing else is left to do
                leaking = answer([by_record[c.id] for c in checks if erasure.holds(c)])
                checks = [replace(c, leaked=c.id in leaking) for c in checks]
            latest.update(checks)
        return checks

    scores = neighbour_scores(forget_enc, retain_enc) if retain_enc else []
    neighbours = nearest(scores, params.neighbour_fraction) if retain_enc else []
    sampler = RetainSampler(retain_enc, neighbours, params.neighbour_share, rng) if retain_enc else None
    retain_rows = params.retain_batch_size or params.batch_size
    optimiser = torch.optim.AdamW(policy.trainable_parameters(), lr=params.lr, weight_decay=params.weight_decay)
    stream = ForgetStream(train_set, params.batch_size, rng)

    # With secret focus: also escalate when the pace is too slow for max_steps (a secret's probability falls
    # steadily but slowly), and let the forget weight grow to the retain weight's scale (a retain term
    # weighted 3 outpulls a forget term held at 1). Not for whole records: on mini-TOFU the default with the
    # pace rule stopped at 590 steps with retain exact match 0.930, against 775 and 0.990 without it (issue 11).
    escalation = Escalation(params.escalate_after, params.max_steps if params.secret_focus else None,
                            max(1.0, params.retain_weight) if params.secret_focus else 1.0)

    def shortfall() -> float | None:
        """How far the forget set is from the rule, continuously: over the records still open, the hinge
        (the share of violating tokens stays flat while margins fall towards tau; the hinge does not), the
        decades by which a secret's probability exceeds its maximum, and 1 per leaking answer. None in
        holdout mode, which runs the paper's rule as published."""
        if not train_mode:
            return None
        return sum(c.hinge + max(0.0, math.log10(max(c.secret_probability, 1e-300) / erasure.secret_limit(c.id)))
                   + c.leaked
                   for c in latest.all() if is_open(c.id))

    loop_started = time.perf_counter()
    step, check_seconds, loss_trace, stop_reason, repair_steps = 0, 0.0, [], None, 0
    while True:
        if rule.due(step):
            t0 = time.perf_counter()
            stop = rule.check(step, trigger, confirm)
            check_seconds += time.perf_counter() - t0
            if stop:
                stop_reason = "alpha"
                break
            algo.forget_weight = escalation.update(step, shortfall(), algo.forget_weight)
        judged_mean = rule.judged_mean(latest.all()) if train_mode else None
        chosen = stream.next(is_open)
        if step >= params.max_steps:
            stop_reason = "max_steps"
            break
        if should_cancel is not None and should_cancel():
            stop_reason = "cancelled"
            break
        if not chosen and sampler is None:
            chosen = train_set[:params.batch_size]  # nothing open and no retain set to repair until the check
        if params.secret_focus and params.replay_every and step % params.replay_every == 0:
            asked = rng.sample(forget_enc, min(len(forget_enc), params.replay_records))
            leaking = answer(asked)
            if train_mode:  # fresh flags: one kept from the last confirmation would keep the trigger shut for good
                latest.update([replace(latest[r.id], leaked=r.id in leaking) for r in asked])
        # The model's own answers ride along: their secret-looking tokens taken out, where they loop the
        # repeated tokens too, the rest kept as theta_0 would continue it; those of the chosen records first.
        extra = [replay[r.id] for r in chosen if r.id in replay]
        chosen_ids = {r.id for r in chosen}
        others = [e for rid, e in replay.items() if rid not in chosen_ids]
        extra += rng.sample(others, min(len(others), max(0, params.batch_size - len(extra))))
        forget_batch = collate(chosen + extra, pad).to(dev) if chosen or extra else None
        repair_steps += forget_batch is None
        retain_batch = collate(sampler.sample(retain_rows), pad).to(dev) if sampler else None
        with autocast(dev):
            loss, parts = algo.loss(forget_batch, retain_batch)
        if forget_batch is not None and algo.last_forget_measurement is not None:
            measured = tuple(t[:len(chosen)] for t in algo.last_forget_measurement)  # the records, not extras
            latest.update([replace(c, leaked=latest[c.id].leaked) for c in checks_of(chosen, measured)])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        if params.grad_clip:
            torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), params.grad_clip)
        optimiser.step()
        step += 1
        if not math.isfinite(parts["total"]):
            raise FloatingPointError(f"loss became {parts['total']} at step {step}")
        loss_trace.append({"step": step, **parts, "forget_rows": len(chosen)})
        if progress is not None:
            progress({"step": step, "max_steps": params.max_steps, "losses": parts,
                      "violation_rate": rule.latest_v, "elapsed": time.perf_counter() - started})
    loop_seconds = time.perf_counter() - loop_started

    # The full statistic at the stop, whatever ended the run: the deciding confirmation when the rule
    # fired (same weights), else a fresh measurement of every record.
    final_checks = rule.last_confirmed if stop_reason == "alpha" else None
    if final_checks is None or {c.id for c in final_checks} != {r.id for r in forget_enc}:
        final_checks = measure(forget_enc)
        if params.secret_focus and stop_reason != "cancelled":  # the leak condition, measured now like the rest
            leaking = answer(forget_enc)
            final_checks = [replace(c, leaked=c.id in leaking) for c in final_checks]
    by_id = {c.id: c for c in final_checks}
    val_checks = [by_id[r.id] for r in val_set]
    final_v = mean_violation(val_checks)
    if progress is not None and stop_reason != "cancelled":
        # One more report, so that the last V a client sees is the one measured at the stop.
        last_losses = {k: v for k, v in (loss_trace[-1] if loss_trace else {}).items()
                       if k not in ("step", "forget_rows")}
        progress({"step": step, "max_steps": params.max_steps, "losses": last_losses,
                  "violation_rate": final_v, "elapsed": time.perf_counter() - started})
    never_trained = set(val_info.get("never_trained", []))
    per_record = [{"id": c.id, "violation": c.violation, "ceiling": calibration.ceilings[c.id],
                   "reproduced": c.reproduced, "active_tokens": c.active_tokens,
                   "secret_tokens": by_record[c.id].secret_tokens, "secret_probability": c.secret_probability,
                   "secret_limit": erasure.secret_limit(c.id),
                   "secret_greedy": c.secret_greedy, "leaked": c.leaked,
                   "meets_condition": erasure.holds(c),
                   "trained": c.id not in never_trained} for c in (by_id[r.id] for r in forget_enc)]
    failing = [r["id"] for r in per_record if not r["meets_condition"]]
    result = {
        "engine_version": ENGINE_VERSION, "method": method, "model": str(model_source), "device": str(dev),
        "stop_reason": stop_reason, "steps": step, "final_violation_rate": final_v,
        "initial_violation_rate": initial_v, "alpha": calibration.summary["alpha"],
        "erasure": {"condition": (SECRET_CONDITION if params.secret_focus else CONDITION) if train_mode
                    else "holdout mode: the mean over D_val alone (the MASC "
                         "paper's rule); the per-record state is reported",
                    "applied": train_mode, "ceilings": calibration.summary["ceilings"],
                    "holdout_v": calibration.summary.get("holdout_v"),
                    "records_meeting_condition": len(per_record) - len(failing), "failing_ids": failing,
                    # The V the rule compares with alpha: over the records without located secrets (None: none).
                    **({"judged_violation_rate": rule.judged_mean(val_checks),
                        "judged_records": len(rule.judged(val_checks))} if train_mode and located else {}),
                    "reproduced_ids": [r["id"] for r in per_record if r["reproduced"]]},
        "per_record": per_record,
        "v_trace": rule.trace, "loss_trace": loss_trace, "validation": val_info,
        "counts": {"forget": len(forget_enc), "retain": len(retain_enc), "holdout": len(holdout)},
        "neighbours": {"count": len(neighbours), "share_of_retain_rows": params.neighbour_share if neighbours else 0,
                       "ids": [retain_enc[j].id for j in neighbours]},
        "repair_steps": repair_steps, "escalations": escalation.trace, "lora": policy.describe(),
        "secrets": {**secret_sources(forget_sources, secrets), "focus": params.secret_focus,
                    "focus_requested": requested_focus,
                    "located": sum(r.focus is not None for r in forget_enc),
                    # whose own greedy answers were trained on (records with located secrets only)
                    "replayed_ids": sorted(replay)},
        "retain_term": "none (no retain records)" if not retain_enc else params.retain_loss,
        "truncated": [{"id": r.id, "dropped_prompt_tokens": r.truncated_tokens}
                      for r in forget_enc + retain_enc if r.truncated_tokens],
        "seed": params.seed, "params": params.as_dict(), "versions": library_versions(),
    }
    result["bound"] = exact_reproduction_bound(
        params.rho, params.beta, [{"id": r["id"], "violation": r["violation"], "active_tokens": r["active_tokens"]}
                                  for r in per_record])
    merged = policy.merged() if stop_reason != "cancelled" else None
    result["timing"] = {"wall_seconds": time.perf_counter() - started, "load_seconds": loop_started - started,
                        "calibration_seconds": calibration_seconds, "loop_seconds": loop_seconds,
                        "stop_check_seconds": check_seconds}
    result["wall_seconds"] = result["timing"]["wall_seconds"]
    result["peak_memory"] = memory.read()
    return UnlearnOutcome(result=result, model=merged, tokenizer=tokenizer)


def _encodable(records: list[dict], tokenizer, max_length: int, seed: int) -> list[EncodedRecord]:
    """Checked records that fit the model's context (a counterfactual or holdout record that does not is
    skipped). A passage's counterfactual keeps its record's id, and so its seeded continuation split."""
    out = []
    for record in records:
        try:
            out.append(encode_record(record, tokenizer, max_length=max_length, seed=seed, what="calibration"))
        except EngineInputError:
            continue
    return out
