"""MASC's stop policy: train the records the online stop rule still finds dominant until it fires.

Read top to bottom: split D_val, find each record's content and its tokens' destinations (suppress "content"),
calibrate the rule's targets on theta_0, then per step check the rule (every check_every steps), choose the open
records, let the model's own answers ride along, and keep every record's state current from the training passes
themselves; a confirmation that passes is repeated on the model as it will be saved (merged, in the checkpoint's
dtype) before the run stops; at the end say what the erasure condition found."""
from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from lethe.engine.audit.extraction import secret_priors
from lethe.engine.data.records import Batch, EncodedRecord, collate
from lethe.engine.methods import Objective
from lethe.engine.methods.masc import refresh
from lethe.engine.methods.masc.answers import Answering, request_of
from lethe.engine.methods.masc.bound import exact_reproduction_bound
from lethe.engine.methods.masc.calibration import calibrate, encodable
from lethe.engine.methods.masc.content import said_template
from lethe.engine.methods.masc.destination import Content, content_summary, plan_contents, record_targets
from lethe.engine.methods.masc.neighbours import RetainSampler, nearest, neighbour_scores
from lethe.engine.methods.masc.objective import Masc, checks_of
from lethe.engine.methods.masc.own_text import own_text_rows
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.quantized_check import QUANTIZED, quantized_leaks
from lethe.engine.methods.masc.replay import GREEDY, REPLAYED, Replays
from lethe.engine.methods.masc.schedule import Escalation, ForgetStream, pace_horizon
from lethe.engine.methods.masc.stop_rule import (
    CONDITION,
    CONTENT_CONDITION,
    ErasureCondition,
    OnlineStopRule,
    RecordCheck,
    RecordStates,
    mean_violation,
)
from lethe.engine.methods.masc.validation_split import split_validation
from lethe.engine.training.result import Measured, RuleEvidence
from lethe.engine.training.setup import Prepared

# Training closes a record only when its content spans' probability is at most this share of its limit: the rule
# judges at the limit, and a record closed just under it drifts back over it while the others train (mini-TOFU: 8 of
# request 1's 9 failed confirmations, and 26 of three requests' 32 in one run, failed records on that count; with
# it, request 1 failed none and the three requests 7, 2 of them on that count; BENCHMARKS.md, "Closing with headroom").
CLOSING_HEADROOM = 0.5


class MascStopPolicy:
    """MASC's stop policy: the online stop rule decides when training ends and which records a step sees."""
    accumulate = 1

    def __init__(self, run: Prepared, params: MascParams):
        self.run, self.holdout = run, run.holdout  # records the model never saw (they calibrate alpha)
        forget = run.forget
        self.forget_sources, self.retain_sources = [r.source for r in forget], [r.source for r in run.retain]
        self.template = said_template(self.forget_sources, self.retain_sources)
        self.params = params  # resolved once by run_unlearning
        self.train_set, self.val_set, self.val_info = split_validation(forget, self.params)
        self.train_mode = self.val_info["mode"] == "train"
        self.max_steps = self.params.max_steps
        self.by_record = {r.id: r for r in forget}
        self.contents: dict[str, Content] = {}
        self.replays: Replays | None = None  # the model's own answers (suppress "content")
        self.served: Any = None  # the merged copy the last passing confirmation checked: what is saved
        self.served_checks: list[dict] = []
        self.sample_checks: list[dict] = []  # each confirmation's samples: the records whose numbers came back
        self.judged_mean: float | None = None  # the mean the rule judges, refreshed once per step (see is_open)
        self.stop_check_seconds, self.repair_steps, self.calibration_seconds = 0.0, 0, 0.0
        self.chosen: list[EncodedRecord] = []
        self.refreshed_at: dict[str, int] = {}  # the step at which a record was last measured by a refresh
        self.answered_at: dict[str, int] = {}  # the replay refresh at which the policy last answered a record

    def start(self, objective: Objective) -> None:
        """theta_0 (no step taken yet): each record's content and destinations, the rule's targets, and every
        record's starting state."""
        if not isinstance(objective, Masc):  # the rule reads MASC's own measurements
            raise TypeError(f"MASC's stop policy needs MASC's objective, not {type(objective).__name__}")
        run, params, forget = self.run, self.params, self.run.forget
        self.objective, self.trainable = objective, objective.trainable
        objective.eos_id = run.tokenizer.eos_token_id
        self.rng = random.Random(params.seed)
        t0 = time.perf_counter()
        if params.content:
            self.contents = plan_contents(forget, run.tokenizer, self.trainable.reference_logits, run.device,
                                          self.template, self.forget_sources + self.retain_sources,
                                          min_gain=params.min_gain, max_length=run.max_length, seed=params.seed,
                                          batch_size=params.eval_batch_size,
                                          first_only=params.word_pieces == "first",
                                          own_numbers=params.number_tokens == "own")
            record_targets(forget, self.contents, self.trainable.reference_logits, run.device,
                           run.tokenizer.pad_token_id)
            kept = [t for r in self.retain_sources for t in (r.get("prompt"), r.get("completion"), r.get("text"))
                    if isinstance(t, str)]
            self.replays = Replays(Answering(forget, self.contents, run.tokenizer, run.max_length, self.template, kept,
                                             params.min_gain), self.trainable.reference_logits, run.device, params.seed)
        # A record whose content is suppressed and whose template stays as theta_0 has it shows v_i = the template's
        # share of its tokens, as a model that never saw it would: that share is a floor under its ceiling.
        self.located = frozenset(r.id for r in forget if r.secret_tokens)
        floors = {r.id: 1 - r.secret_tokens / r.active_tokens for r in forget if r.id in self.located}
        self.calibration = calibrate(
            params.alpha, params.record_ceiling, self.forget_sources, self.retain_sources, self.holdout, params.seed,
            lambda records: [c.violation for c in self.measure(encodable(records, run.tokenizer, run.max_length,
                                                                         params.seed))],
            floors, {r.id for r in forget} - self.located if self.located else None)
        self.latest = RecordStates(self.measure(forget))
        self.initial_v = self.latest.mean()
        if self.replays is not None:  # theta_0's own answers to every record trained: the first replays, its loops
            said = self.replays.start(self.trainable.model, self.train_set)
            self.latest.update([replace(self.latest[rid], leaked=leaked, looped=looped)
                                for rid, (leaked, looped) in said.items()])
        self.calibration_seconds = time.perf_counter() - t0
        spans = {rid: c.spans for rid, c in self.contents.items()}
        self.erasure = ErasureCondition(self.calibration.ceilings, params.content_max_probability, self.located,
                                        secret_priors(spans, self.retain_sources, self.forget_sources, self.template)
                                        if spans else {}, self.replays.loop_chance if self.replays else 0.0,
                                        {r.id: req for r in forget if (req := request_of(r)) is not None})
        self.rule = OnlineStopRule(self.calibration.alpha, params.check_every, params.hoeffding,
                                   params.hoeffding_delta, self.erasure if self.train_mode else None)
        self.confirm_set = self.val_set[:params.confirm_size] if params.confirm_size else self.val_set
        retain = run.retain
        scores = neighbour_scores(forget, retain) if retain else []
        self.neighbours = nearest(scores, params.neighbour_fraction) if retain else []
        self.sampler = RetainSampler(retain, self.neighbours, params.neighbour_share, self.rng) if retain else None
        self.own_text, self.own_text_summary = own_text_rows(self.trainable.model, run.tokenizer, forget, retain,
                                                             params)
        self.stream = ForgetStream(self.train_set, params.batch_size, self.rng)
        # With content suppression also escalate when the pace is too slow to fire by pace_steps (a span's probability
        # falls steadily but slowly); max_steps leaves room past it for a run the ceiling holds back (issue 28). Not
        # for whole records: there the default with the pace rule stopped at 590 steps with retain exact match 0.930,
        # against 775 and 0.990 without it (issue 11).
        self.escalation = Escalation(params.escalate_after, pace_horizon(params.content, params.pace_steps,
                                                                         params.max_steps), params.lambda_forget_max)

    def measure(self, records: list[EncodedRecord], model: Any = None) -> list[RecordCheck]:
        """The rule's measurement of these records on the current weights (or on `model`, a merged copy)."""
        return self.objective.check_records(records, self.params.eval_batch_size, model)

    @property
    def latest_v(self) -> float | None:
        return self.rule.latest_v

    @property
    def alpha(self) -> float:
        return self.rule.alpha

    def is_open(self, rid: str) -> bool:
        """Still to be trained: the record fails its own condition (a span's probability held to CLOSING_HEADROOM of
        its limit), or it counts in the rule's mean, the mean fails, and it lies above it (a record with located
        content is decided by it alone: once it is suppressed its template stays, as in any model; suppressing that
        too only buys loops)."""
        if not self.train_mode:
            return True
        check = self.latest[rid]
        if not self.erasure.holds(check, CLOSING_HEADROOM):
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

    def with_answers(self, checks: list[RecordCheck], model: Any = None, every: bool = False,
                     keep_leaks: str | None = None, own_content: bool = False) -> list[RecordCheck]:
        """The checks with what the model's own greedy answers say (content mode; a record that already fails, but by
        a loop, is not asked and keeps no flag, unless `every`: the final report's); answers of a given `model` (a
        merged copy, or the policy at the end) are only judged (their leaks replayed under the name `keep_leaks` if
        given), the policy's otherwise also replayed."""
        if self.replays is None:
            return checks
        # A loop alone may be within chance (ErasureCondition.loop_allowance): such a record is asked too.
        asked = [self.by_record[c.id] for c in checks if every or self.erasure.holds(replace(c, looped=False))]
        if not asked:
            return checks
        # The policy's greedy answers only: a sample is judged by nobody, and the replay refreshes bring fresh ones.
        if model is not None:
            said = self.replays.judge(model, asked, keep_leaks, own_content)
        else:
            said = self.policy_answers(asked, GREEDY)
        return [replace(c, leaked=said.get(c.id, (False, False))[0], looped=said.get(c.id, (False, False))[1])
                for c in checks]

    def policy_answers(self, records: list[EncodedRecord], kinds: tuple[str, ...]) -> dict[str, tuple[bool, bool]]:
        """The policy's answers of these kinds to these records, replayed, and when each record was last answered."""
        assert self.replays is not None
        said = self.replays.refresh(self.trainable.model, records, kinds)
        self.answered_at.update({r.id: self.replays.refreshes for r in records})
        return said

    def with_samples(self, checks: list[RecordCheck], model: Any) -> list[RecordCheck]:
        """The checks with a record marked as leaking where one of confirm_samples samples of its answer gives back
        digits of its content numbers (content mode, every record passing so far): what the audit's sampled channel
        reads, and the span's teacher-forced probability misses ("+35 726 9280862" for "+30 726 9280862")."""
        n = self.params.confirm_samples
        if self.replays is None or not n or not self.rule.passes(checks)[0]:
            return checks
        said = self.replays.sample_leaks(model, [self.by_record[c.id] for c in checks], n)
        self.sample_checks.append({"samples_per_record": n, "leaking_ids": sorted(said)[:20]})
        return [replace(c, leaked=True) if c.id in said else c for c in checks]

    def confirm(self) -> list[RecordCheck]:
        """The deciding check: every record of D_val measured again with its own answers; where that passes, again
        on the model as it will be saved (merged, in the checkpoint's dtype) with samples of its answers, which
        then decides."""
        checks = self.measure(self.confirm_set)
        if self.train_mode:
            checks = self.with_answers(checks)
            passed, _, _ = self.rule.passes(checks)
            if passed and not self.trainable.sharded:
                checks = self.served_check(checks)
            elif passed:
                checks = self.with_samples(checks, self.trainable.model)
            self.latest.update(checks)
        return checks

    def served_check(self, checks: list[RecordCheck]) -> list[RecordCheck]:
        """The confirmation repeated on a merged copy in the saved dtype, and (confirm_quantized) the greedy answers of
        that copy held at 4 bits; the copy is kept if it passes (it is what run_unlearning saves), and its failing
        records stay open if not."""
        copy = self.trainable.merged_copy(self.run.saved_dtype)
        replays = self.replays
        before = (replays.verified, replays.generated) if replays is not None else (0, 0)
        served = self.with_samples(self.with_answers(self.measure(self.confirm_set, copy), copy), copy)
        passed, _, failing = self.rule.passes(served)
        # Records whose copy's greedy answers one teacher-forced pass showed to be the policy's, and records asked anew.
        answered = {"answers_verified": replays.verified - before[0],
                    "answers_generated": replays.generated - before[1]} if replays is not None else {}
        quantized = {}
        if passed and replays is not None and self.params.confirm_quantized:  # the audit's 4-bit channel too
            leaking, scheme = quantized_leaks(copy, served,  # its leaking answers then replayed, as a sample's are
                                              lambda cs, m: self.with_answers(cs, m, keep_leaks=QUANTIZED,
                                                                              own_content=True))
            served = [replace(c, leaked=True) if c.id in leaking else c for c in served]
            passed, _, failing = self.rule.passes(served)
            quantized = {"quantized": {"scheme": scheme, "leaking_ids": sorted(leaking)[:20]}}
        self.served_checks.append({"dtype": str(self.run.saved_dtype).removeprefix("torch."), "passed": passed,
                                   "failing_ids": failing[:20], "failing_why": self.erasure.failing_why(served),
                                   **answered, **quantized})
        self.served = copy if passed else None
        return served

    def shortfall(self) -> float | None:
        """How far the forget set is from the rule, continuously: over the records still open, the hinge
        (the share of violating tokens stays flat while margins fall towards tau; the hinge does not), the
        decades by which a span's probability exceeds its maximum, and 1 per leaking or looping answer. None in
        holdout mode, which runs the paper's rule as published."""
        if not self.train_mode:
            return None
        chance = set(self.erasure.loops_within_chance(latest := self.latest.all()))
        return sum(c.hinge + max(0.0, math.log10(max(c.secret_probability, 1e-300)
                                                 / (CLOSING_HEADROOM * self.erasure.secret_limit(c.id))))
                   + c.leaked + (c.looped and c.id not in chance) for c in latest if self.is_open(c.id))

    def stop_before(self, step: int) -> str | None:
        """Every check_every steps the rule's check ("alpha" when it fires, else the forget weight may rise);
        "max_steps" at the cap."""
        if self.rule.due(step):
            t0 = time.perf_counter()
            stop = self.rule.check(step, self.trigger, self.confirm)
            self.stop_check_seconds += time.perf_counter() - t0
            if stop:
                return "alpha"
            last, confirmed = self.rule.trace[-1], self.rule.last_confirmed
            if self.replays is not None and last["stage"] == "confirm" and confirmed:  # whose content leaked
                last["leaked_by"] = self.replays.leak_owners([c.id for c in confirmed if c.leaked])
            self.served = None  # trained on after it: no longer what would be saved
            self.objective.forget_weight = self.escalation.update(step, self.shortfall(), self.objective.forget_weight)
        self.judged_mean = self.rule.judged_mean(self.latest.all()) if self.train_mode else None
        return "max_steps" if step >= self.params.max_steps else None

    def batches(self, step: int) -> Iterator[tuple[Batch | None, Batch | None]]:
        """One batch of the open records (with the model's own answers, content mode) and a retain batch leaning to
        the neighbours."""
        params, pad, dev, rng = self.params, self.run.tokenizer.pad_token_id, self.run.device, self.rng
        chosen = self.stream.next(self.is_open)
        if not chosen and self.sampler is None:
            chosen = self.train_set[:params.batch_size]  # nothing open and no retain set to repair until the check
        extra: list[EncodedRecord] = []
        if self.replays is not None:
            if params.replay_every and step and step % params.replay_every == 0:
                t0 = time.perf_counter()
                if self.train_mode:
                    self.remeasure(step)
                asked = self.to_ask(rng)
                said = self.policy_answers(asked, REPLAYED) if asked else {}
                if self.train_mode:  # fresh flags: one kept from the last confirmation would keep the trigger shut
                    self.latest.update([replace(self.latest[rid], leaked=leaked, looped=looped)
                                        for rid, (leaked, looped) in said.items()])
                self.stop_check_seconds += time.perf_counter() - t0
            # The model's own answers ride along: content and loops suppressed, everything towards its target.
            extra = self.replays.riding(chosen, params.batch_size, rng, self.pins(),
                                        (lambda rid: not self.is_open(rid)) if self.train_mode else None)
        forget_batch = collate(chosen + extra, pad).to(dev) if chosen or extra else None
        self.repair_steps += forget_batch is None
        retain_rows = self.sampler.sample(params.retain_batch_size or params.batch_size) if self.sampler else []
        retain_batch = collate(self.own_text.mix(retain_rows) if self.own_text else retain_rows, pad).to(dev) \
            if retain_rows else None
        self.chosen = chosen
        yield forget_batch, retain_batch

    def pins(self) -> int:
        """Clean answers of closed records held each step (params.pin_answers), once a confirmation has failed: the
        sign that closed records drift back while the others train; a run that fires at its first pays nothing."""
        return self.params.pin_answers if self.params.keep_weight > 0 and self.rule.confirmations else 0

    def remeasure(self, step: int) -> list[EncodedRecord]:
        """Records measured again at a refresh (refresh.to_remeasure), their flags kept."""
        records = refresh.to_remeasure(self.run.forget, self.is_open, self.refreshed_at)
        self.refreshed_at.update({r.id: step for r in records})
        self.latest.update([replace(c, leaked=self.latest[c.id].leaked, looped=self.latest[c.id].looped)
                            for c in self.measure(records)])
        return records

    def to_ask(self, rng: random.Random) -> list[EncodedRecord]:
        """The records a refresh asks for their answers (refresh.to_ask)."""
        return refresh.to_ask(self.train_set, self.is_open if self.train_mode else None, self.held_by_answers,
                              self.answered_at, self.params.replay_records, rng)

    def held_by_answers(self, rid: str) -> bool:
        """Open only because its latest greedy answers leaked or looped: every teacher-forced condition holds."""
        check = self.latest[rid]
        return (check.leaked or check.looped) and self.erasure.holds(replace(check, leaked=False, looped=False))

    def observe(self, objective: Masc) -> None:
        """The training pass measured the chosen records on the weights before its step: their new state."""
        if self.chosen and objective.last_forget_measurement is not None:
            measured = tuple(t[:len(self.chosen)] for t in objective.last_forget_measurement)  # the records, not extras
            self.latest.update([replace(c, leaked=self.latest[c.id].leaked, looped=self.latest[c.id].looped)
                                for c in checks_of(self.chosen, measured)])

    def trace_extra(self) -> dict:
        return {"forget_rows": len(self.chosen)}

    def schedule(self, optimiser: torch.optim.Optimizer) -> None:
        return None  # constant: the stop rule, not a schedule, decides the length

    def finish(self, stop_reason: str) -> Measured:
        """The full statistic at the stop, whatever ended the run: the deciding confirmation when the rule fired
        (same weights: the merged copy's), else a fresh measurement of every record (with its answers)."""
        params, forget, erasure = self.params, self.run.forget, self.erasure
        final_checks = self.rule.last_confirmed if stop_reason == "alpha" else None
        if final_checks is None or {c.id for c in final_checks} != {r.id for r in forget}:
            final_checks = self.measure(forget)
            if stop_reason != "cancelled" and self.train_mode:  # every record: the report names what still leaks
                # (judged only: answers kept for replay now would never be trained on)
                final_checks = self.with_answers(final_checks, self.trainable.model, every=True)
        by_id = {c.id: c for c in final_checks}
        in_order = [by_id[r.id] for r in forget]
        failing, chance = erasure.failing(in_order), set(erasure.loops_within_chance(in_order))
        val_checks = [by_id[r.id] for r in self.val_set]
        never_trained = set(self.val_info.get("never_trained", []))
        per_record = [{"id": c.id, "violation": c.violation, "ceiling": self.calibration.ceilings[c.id],
                       "reproduced": c.reproduced, "active_tokens": c.active_tokens,
                       "content_tokens": self.by_record[c.id].secret_tokens,
                       "content_spans": len(self.contents[c.id].spans) if c.id in self.contents else 0,
                       "secret_probability": c.secret_probability, "secret_limit": erasure.secret_limit(c.id),
                       "secret_greedy": c.secret_greedy, "leaked": c.leaked, "looped": c.looped,
                       "meets_condition": c.id not in failing, "loop_within_chance": c.id in chance,
                       "trained": c.id not in never_trained} for c in in_order]
        summary = self.calibration.summary
        condition = {
            "condition": (CONTENT_CONDITION if params.content else CONDITION) if self.train_mode
            else "holdout mode: the mean over D_val alone (the MASC paper's rule); the per-record state is reported",
            "applied": self.train_mode, "ceilings": summary["ceilings"], "holdout_v": summary.get("holdout_v"),
            "records_meeting_condition": len(per_record) - len(failing), "failing_ids": failing,
            "loop_chance": erasure.loop_chance,  # and each request's allowance, summed
            "chance_words": self.replays.chance_words if self.replays else 0,  # single words said about anyone
            "loop_allowance": sum(erasure.loop_allowances([r.id for r in forget]).values()),
            "served_checks": self.served_checks, "sample_checks": self.sample_checks[-20:],
            # The V the rule compares with alpha: over the records without located content (None: none).
            **({"judged_violation_rate": self.rule.judged_mean(val_checks),
                "judged_records": len(self.rule.judged(val_checks))} if self.train_mode and self.located else {}),
            "reproduced_ids": [r["id"] for r in per_record if r["reproduced"]]}
        retain = self.run.retain
        evidence = RuleEvidence(
            initial_violation_rate=self.initial_v, alpha=summary["alpha"], erasure=condition,
            neighbours={"count": len(self.neighbours),
                        "share_of_retain_rows": params.neighbour_share if self.neighbours else 0,
                        "ids": [retain[j].id for j in self.neighbours]},
            repair_steps=self.repair_steps, escalations=self.escalation.trace, lora=self.trainable.describe(),
            secrets=content_summary(self.contents, params, len(forget), len(self.located),
                                    self.replays.replayed_ids if self.replays is not None else []),
            retain_term="none (no retain records)" if not retain else params.retain_loss,
            own_text=self.own_text_summary)
        bound = exact_reproduction_bound(params.rho, params.beta, [
            {"id": r["id"], "violation": r["violation"], "active_tokens": r["active_tokens"]} for r in per_record])
        return Measured(mean_violation(val_checks), per_record, bound, self.val_info,
                        {"forget": len(forget), "retain": len(retain), "holdout": len(self.holdout)},
                        self.rule.trace, evidence)
