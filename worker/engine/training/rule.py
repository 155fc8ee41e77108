"""MASC's stop policy: train the records the online stop rule still finds dominant until it fires.

Read top to bottom: decide secret focus from the request's records, split D_val, calibrate the rule's
targets on theta_0, then per step check the rule (every check_every steps), choose the open records, let the
model's own answers ride along (secret focus), and keep every record's state current from the training passes
themselves; at the end measure every record once more and say what the erasure condition found."""
from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from worker.engine.bound import exact_reproduction_bound
from worker.engine.calibration import calibrate
from worker.engine.counterfactual import shared_template
from worker.engine.errors import EngineInputError
from worker.engine.extraction import own_answers, request_secrets, secret_priors, secret_sources
from worker.engine.methods.masc import Masc, checks_of
from worker.engine.neighbours import RetainSampler, nearest, neighbour_scores
from worker.engine.params import MascParams
from worker.engine.records import Batch, EncodedRecord, collate, encode_record
from worker.engine.schedule import Escalation, ForgetStream
from worker.engine.secret_spans import named_secrets, secret_focus
from worker.engine.stop_rule import ErasureCondition, OnlineStopRule, RecordCheck, RecordStates, mean_violation
from worker.engine.training.result import Measured, RuleEvidence
from worker.engine.training.setup import Prepared

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


class OnlineRule:
    """MASC's stop policy: the online stop rule decides when training ends and which records a step sees."""
    accumulate = 1

    def __init__(self, run: Prepared, params: MascParams):
        self.run, self.holdout = run, run.holdout  # records the model never saw (they calibrate alpha)
        forget = run.forget
        self.forget_sources, self.retain_sources = [r.source for r in forget], [r.source for r in run.retain]
        self.template = shared_template(self.forget_sources, self.retain_sources)
        self.secrets = request_secrets(self.forget_sources, self.retain_sources, self.template)
        # "auto" focuses on the secrets a request names, and suppresses the other records whole (see params).
        focus_ids = ({r.id for r in forget} if params.secret_focus is True else
                     {r.id for r in forget if named_secrets(r.source)} if params.secret_focus == "auto" else set())
        self.requested_focus, self.params = params.secret_focus, params.resolved(bool(focus_ids))
        for record in forget:  # which tokens of each record are its secret, and which the template around it
            if record.id in focus_ids:
                record.focus = secret_focus(record, self.secrets[record.id], run.tokenizer, self.template)
        self.train_set, self.val_set, self.val_info = split_validation(forget, self.params)
        self.train_mode = self.val_info["mode"] == "train"
        self.max_steps = self.params.max_steps
        self.by_record = {r.id: r for r in forget}
        self.replay: dict[str, EncodedRecord] = {}  # the model's latest own answer to each forget prompt
        self.judged_mean: float | None = None  # the mean the rule judges, refreshed once per step (see is_open)
        self.stop_check_seconds, self.repair_steps, self.calibration_seconds = 0.0, 0, 0.0
        self.chosen: list[EncodedRecord] = []

    def start(self, objective: Masc) -> None:
        """theta_0 (no step taken yet): the rule's targets, and every record's starting state."""
        run, params, forget = self.run, self.params, self.run.forget
        self.objective, self.policy = objective, objective.policy
        self.rng = random.Random(params.seed)
        t0 = time.perf_counter()
        # A record whose secret is suppressed and whose template stays as theta_0 has it shows v_i = the template's
        # share of its tokens, as a model that never saw it would: that share is a floor under its ceiling.
        floors = {r.id: 1 - r.secret_tokens / r.active_tokens for r in forget if r.focus is not None}
        self.located = frozenset(r.id for r in forget if r.focus is not None and r.secret_tokens)
        self.calibration = calibrate(
            params.alpha, params.record_ceiling, self.forget_sources, self.retain_sources, self.holdout, params.seed,
            lambda records: [c.violation for c in self.measure(_encodable(records, run.tokenizer, run.max_length,
                                                                          params.seed))],
            floors, {r.id for r in forget} - self.located if self.located else None)
        self.latest = RecordStates(self.measure(forget))
        self.initial_v = self.latest.mean()
        self.calibration_seconds = time.perf_counter() - t0
        self.erasure = ErasureCondition(self.calibration.ceilings, params.secret_max_probability, self.located,
                                        secret_priors(self.secrets, self.retain_sources, self.forget_sources,
                                                      self.template))
        self.rule = OnlineStopRule(self.calibration.alpha, params.check_every, params.hoeffding,
                                   params.hoeffding_delta, self.erasure if self.train_mode else None)
        self.confirm_set = self.val_set[:params.confirm_size] if params.confirm_size else self.val_set
        retain = run.retain
        scores = neighbour_scores(forget, retain) if retain else []
        self.neighbours = nearest(scores, params.neighbour_fraction) if retain else []
        self.sampler = RetainSampler(retain, self.neighbours, params.neighbour_share, self.rng) if retain else None
        self.stream = ForgetStream(self.train_set, params.batch_size, self.rng)
        # With secret focus: also escalate when the pace is too slow for max_steps (a secret's probability falls
        # steadily but slowly), and let the forget weight grow to the retain weight's scale (a retain term
        # weighted 3 outpulls a forget term held at 1). Not for whole records: on mini-TOFU the default with the
        # pace rule stopped at 590 steps with retain exact match 0.930, against 775 and 0.990 without it (issue 11).
        self.escalation = Escalation(params.escalate_after, params.max_steps if params.secret_focus else None,
                                     max(1.0, params.retain_weight) if params.secret_focus else 1.0)

    def measure(self, records: list[EncodedRecord]) -> list[RecordCheck]:
        """The rule's measurement of these records on the current weights."""
        return self.objective.check_records(records, self.params.eval_batch_size)

    @property
    def latest_v(self) -> float | None:
        return self.rule.latest_v

    @property
    def alpha(self) -> float:
        return self.rule.alpha

    def is_open(self, rid: str) -> bool:
        """Still to be trained: the record fails its own condition, or it counts in the rule's mean, the
        mean fails, and it lies above it (a record with located secrets is decided by them alone: once
        they are suppressed its template stays, as in any model; suppressing that too only buys loops)."""
        if not self.train_mode:
            return True
        check = self.latest[rid]
        if not self.erasure.holds(check):
            return True
        target = self.rule.mean_target(max(1, len(self.confirm_set) - len(self.located)))
        return (rid not in self.located and self.judged_mean is not None and self.judged_mean > target
                and check.violation > target)

    def trigger(self) -> list[RecordCheck]:
        """The cheap check: the records' latest states (train mode) or a seeded sample of D_val (holdout mode)."""
        if self.train_mode:  # the latest state of every record, kept current by the training passes: free
            return self.latest.all()
        size = self.params.trigger_size
        return self.measure(self.confirm_set if len(self.confirm_set) <= size else self.rng.sample(self.confirm_set,
                                                                                                   size))

    def answer(self, records: list[EncodedRecord]) -> set[str]:
        """Refresh the model's own answers to these prompts; the ids of those that give a secret back. Only
        the answers of records with located secrets are trained on: a record suppressed whole would have its
        own answer held at theta_0 by the fluency term, against its own suppression (it stayed reproduced for
        400 steps on the test fixture)."""
        fresh = own_answers(self.policy.model, self.run.tokenizer, records, self.secrets, self.run.max_length,
                            self.template)
        self.replay.update({rid: example for rid, (example, _) in fresh.items() if rid in self.located})
        return {rid for rid, (_, leaked) in fresh.items() if leaked}

    def confirm(self) -> list[RecordCheck]:
        """The deciding check: every record of D_val measured again (and, with secret focus, its own answer)."""
        checks = self.measure(self.confirm_set)
        if self.train_mode:
            if self.params.secret_focus:  # the model's own greedy answers, where nothing else is left to do
                leaking = self.answer([self.by_record[c.id] for c in checks if self.erasure.holds(c)])
                checks = [replace(c, leaked=c.id in leaking) for c in checks]
            self.latest.update(checks)
        return checks

    def shortfall(self) -> float | None:
        """How far the forget set is from the rule, continuously: over the records still open, the hinge
        (the share of violating tokens stays flat while margins fall towards tau; the hinge does not), the
        decades by which a secret's probability exceeds its maximum, and 1 per leaking answer. None in
        holdout mode, which runs the paper's rule as published."""
        if not self.train_mode:
            return None
        return sum(c.hinge + max(0.0, math.log10(max(c.secret_probability, 1e-300) / self.erasure.secret_limit(c.id)))
                   + c.leaked for c in self.latest.all() if self.is_open(c.id))

    def stop_before(self, step: int) -> str | None:
        """Every check_every steps the rule's check ("alpha" when it fires, else the forget weight may rise);
        "max_steps" at the cap."""
        if self.rule.due(step):
            t0 = time.perf_counter()
            stop = self.rule.check(step, self.trigger, self.confirm)
            self.stop_check_seconds += time.perf_counter() - t0
            if stop:
                return "alpha"
            self.objective.forget_weight = self.escalation.update(step, self.shortfall(), self.objective.forget_weight)
        self.judged_mean = self.rule.judged_mean(self.latest.all()) if self.train_mode else None
        return "max_steps" if step >= self.params.max_steps else None

    def batches(self, step: int) -> Iterator[tuple[Batch | None, Batch | None]]:
        """One batch of the open records (with their own answers under secret focus) and a retain batch leaning to
        the neighbours."""
        params, pad, dev, rng = self.params, self.run.tokenizer.pad_token_id, self.run.device, self.rng
        chosen = self.stream.next(self.is_open)
        if not chosen and self.sampler is None:
            chosen = self.train_set[:params.batch_size]  # nothing open and no retain set to repair until the check
        if params.secret_focus and params.replay_every and step % params.replay_every == 0:
            asked = rng.sample(self.run.forget, min(len(self.run.forget), params.replay_records))
            leaking = self.answer(asked)
            if self.train_mode:  # fresh flags: one kept from the last confirmation would keep the trigger shut for good
                self.latest.update([replace(self.latest[r.id], leaked=r.id in leaking) for r in asked])
        # The model's own answers ride along: their secret-looking tokens taken out, where they loop the
        # repeated tokens too, the rest kept as theta_0 would continue it; those of the chosen records first.
        extra = [self.replay[r.id] for r in chosen if r.id in self.replay]
        chosen_ids = {r.id for r in chosen}
        others = [e for rid, e in self.replay.items() if rid not in chosen_ids]
        extra += rng.sample(others, min(len(others), max(0, params.batch_size - len(extra))))
        forget_batch = collate(chosen + extra, pad).to(dev) if chosen or extra else None
        self.repair_steps += forget_batch is None
        retain_batch = collate(self.sampler.sample(params.retain_batch_size or params.batch_size), pad).to(dev) \
            if self.sampler else None
        self.chosen = chosen
        yield forget_batch, retain_batch

    def observe(self, objective: Masc) -> None:
        """The training pass measured the chosen records on the weights before its step: their new state."""
        if self.chosen and objective.last_forget_measurement is not None:
            measured = tuple(t[:len(self.chosen)] for t in objective.last_forget_measurement)  # the records, not extras
            self.latest.update([replace(c, leaked=self.latest[c.id].leaked) for c in checks_of(self.chosen, measured)])

    def trace_extra(self) -> dict:
        return {"forget_rows": len(self.chosen)}

    def schedule(self, optimiser: torch.optim.Optimizer) -> None:
        return None  # constant: the stop rule, not a schedule, decides the length

    def finish(self, stop_reason: str) -> Measured:
        """The full statistic at the stop, whatever ended the run: the deciding confirmation when the rule fired
        (same weights), else a fresh measurement of every record."""
        params, forget, erasure = self.params, self.run.forget, self.erasure
        final_checks = self.rule.last_confirmed if stop_reason == "alpha" else None
        if final_checks is None or {c.id for c in final_checks} != {r.id for r in forget}:
            final_checks = self.measure(forget)
            if params.secret_focus and stop_reason != "cancelled":  # the leak condition, measured now like the rest
                leaking = self.answer(forget)
                final_checks = [replace(c, leaked=c.id in leaking) for c in final_checks]
        by_id = {c.id: c for c in final_checks}
        val_checks = [by_id[r.id] for r in self.val_set]
        never_trained = set(self.val_info.get("never_trained", []))
        per_record = [{"id": c.id, "violation": c.violation, "ceiling": self.calibration.ceilings[c.id],
                       "reproduced": c.reproduced, "active_tokens": c.active_tokens,
                       "secret_tokens": self.by_record[c.id].secret_tokens,
                       "secret_probability": c.secret_probability, "secret_limit": erasure.secret_limit(c.id),
                       "secret_greedy": c.secret_greedy, "leaked": c.leaked, "meets_condition": erasure.holds(c),
                       "trained": c.id not in never_trained} for c in (by_id[r.id] for r in forget)]
        failing = [r["id"] for r in per_record if not r["meets_condition"]]
        summary = self.calibration.summary
        condition = {
            "condition": (SECRET_CONDITION if params.secret_focus else CONDITION) if self.train_mode
            else "holdout mode: the mean over D_val alone (the MASC paper's rule); the per-record state is reported",
            "applied": self.train_mode, "ceilings": summary["ceilings"], "holdout_v": summary.get("holdout_v"),
            "records_meeting_condition": len(per_record) - len(failing), "failing_ids": failing,
            # The V the rule compares with alpha: over the records without located secrets (None: none).
            **({"judged_violation_rate": self.rule.judged_mean(val_checks),
                "judged_records": len(self.rule.judged(val_checks))} if self.train_mode and self.located else {}),
            "reproduced_ids": [r["id"] for r in per_record if r["reproduced"]]}
        retain = self.run.retain
        evidence = RuleEvidence(
            initial_violation_rate=self.initial_v, alpha=summary["alpha"], erasure=condition,
            neighbours={"count": len(self.neighbours),
                        "share_of_retain_rows": params.neighbour_share if self.neighbours else 0,
                        "ids": [retain[j].id for j in self.neighbours]},
            repair_steps=self.repair_steps, escalations=self.escalation.trace, lora=self.policy.describe(),
            secrets={**secret_sources(self.forget_sources, self.secrets), "focus": params.secret_focus,
                     "focus_requested": self.requested_focus, "located": sum(r.focus is not None for r in forget),
                     # whose own greedy answers were trained on (records with located secrets only)
                     "replayed_ids": sorted(self.replay)},
            retain_term="none (no retain records)" if not retain else params.retain_loss)
        bound = exact_reproduction_bound(params.rho, params.beta, [
            {"id": r["id"], "violation": r["violation"], "active_tokens": r["active_tokens"]} for r in per_record])
        return Measured(mean_violation(val_checks), per_record, bound, self.val_info,
                        {"forget": len(forget), "retain": len(retain), "holdout": len(self.holdout)},
                        self.rule.trace, evidence)


def _encodable(records: list[dict], tokenizer: Any, max_length: int, seed: int) -> list[EncodedRecord]:
    """Checked records that fit the model's context (a counterfactual or holdout record that does not is
    skipped). A passage's counterfactual keeps its record's id, and so its seeded continuation split."""
    out = []
    for record in records:
        try:
            out.append(encode_record(record, tokenizer, max_length=max_length, seed=seed, what="calibration"))
        except EngineInputError:
            continue
    return out
