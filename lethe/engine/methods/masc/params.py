"""MASC parameters, their validation, and the named presets of SPEC section 3."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lethe.engine.contract.parameters import SharedParams, _number, internal, param, parse_params


@dataclass
class MascParams(SharedParams):
    method: str = internal("masc", "the method these parameters are for")
    # The objective (SPEC section 3).
    alternatives: str = param("self", "where the k alternatives come from: the current model (\"self\") or theta_0 "
                                      "(\"teacher\")", choices=("self", "teacher"))
    k: int = param(10, "alternatives in the restricted margin (the k highest-logit tokens other than the gold one)",
                   ge=1, le=4096)
    beta: float = param(1.0, "inverse temperature of the restricted margin (Proposition 1 holds at 1)", gt=0)
    rho: float = param(0.5, "a token is suppressed when its restricted probability is <= rho (tau = log rho/(1-rho))",
                       gt=0, lt=1)
    eta: float = param(0.5, "width of the buffered hinge below tau", gt=0)
    delta: float = param(0.5, "teacher mode: keep alternatives within delta logits of theta_0's best non-gold token",
                         ge=0)
    # Measured: 0.1 (the paper's) costs neighbours on models of 1-4 M parameters.
    lambda_forget: float = param(0.01, "weight of the forget hinge (the loop doubles it when the rule stalls, see "
                                       "escalate_after)", gt=0)
    # Issue 28: the escalation's top buys the erasure with collateral (one request on the sequential fixture: up to 1
    # within 1,000 steps, 40/40 records, model utility 0.859 of 0.998; up to 0.1, 32/40 by 1,000 steps; up to 0.1
    # with room to 2,000, 40/40 at 1,980, 0.963). On the customer benchmark (3 architectures x 3 seeds x plain/named)
    # every run fired the same either way, in 270-465 steps; 1 with 1,000 steps is the preset "fast".
    lambda_forget_max: float = param(0.1, "the highest lambda_forget the escalation may reach (a lambda_forget "
                                          "already above it stays where it is)", gt=0)
    escalate_after: int = param(10, "checks without progress before lambda_forget doubles, up to "
                                    "lambda_forget_max (with content suppression also when too slow for pace_steps)",
                                ge=0, note="0: never")
    # "auto": 3 with content suppression (it kept retain exact match on the customer benchmark, issue 11), else 1.
    # Issue 28: 30 on a run's successors only (3 on the first) did not hold a stream: on the sequential chain utility
    # 0.974, 0.958, 0.941 and both earlier sets said a secret again ("Carmen Montenegro"); BENCHMARKS.md.
    lambda_retain: float | str = param("auto", "weight of the retain term; \"auto\": 3 with suppress \"content\", "
                                               "else 1", ge=0, auto=True)
    retain_loss: str = param("kl", "retain term: KL(pi_0 || pi_theta) on retain tokens, or their NLL",
                             choices=("kl", "nll"))
    # "auto": 3 with content suppression and the KL retain term (3 kept retain EM >= 0.976 on the customer benchmark
    # where 1 let it fall to 0.929, issue 11); 0 otherwise (whole records, as published, or "nll", which has no
    # theta_0 to keep gaps from).
    lambda_keep: float | str = param("auto", "with the KL retain term: weight of keeping each retain token's argmax "
                                             "gap as theta_0 had it, up to keep_gap logits; \"auto\": 3 with suppress "
                                             "\"content\", else 0", ge=0, auto=True, note="0: off")
    keep_gap: float = param(2.0, "the largest argmax gap (logits) lambda_keep holds", gt=0)
    # "auto": 8 with content suppression and the KL retain term, else 0 (as published). Issue 28: the KL left the
    # logits below each retain token's argmax free, and one request's update stirred every logit of the model's
    # answers by about 15 % of their spread, retained or not; the weakest token of each answer then flipped first.
    lambda_logits: float | str = param("auto", "with the KL retain term: weight of keeping the retain tokens' whole "
                                               "logit vectors where theta_0 had them (centred, squared distance "
                                               "relative to theta_0's own spread); \"auto\": 8 with suppress "
                                               "\"content\", else 0", ge=0, auto=True, note="0: off")
    # Where the suppressed tokens go (SPEC section 3, issue 24): a hinge alone has no destination, and in a
    # memorised model the alternatives it promotes are tokens of the same records (loops, cross-record leaks).
    suppress: str = param(
        "content", "what the forget term suppresses: \"content\" = each record's own content (its words and "
                   "numbers whose memorisation gain against counterfactuals of the record reaches min_gain; the "
                   "request's named `secrets` where given), every token moved towards theta_0's prediction about "
                   "someone else with the content at zero, the model's own answers replayed and read by the rule; "
                   "\"whole\" = every active token, no destination (as published)", choices=("content", "whole"))
    min_gain: float = param(2.0, "content: memorisation gain (nats: log p_0 in the record's context minus in its "
                                 "counterfactuals') from which a word or number is the record's own content", ge=0)
    # Issue 28: on the sequential fixture (a 2,048-token vocabulary) half the forget tokens were content pieces such
    # as "ing" and "ar", and suppressing them broke world facts mid-word ("Chernobyl Po, US7."): "first" kept them
    # (utility 0.949 against 0.864 on authors 186-187); on the customer benchmark, whose words are single tokens,
    # both gave the same figures in all 18 runs.
    word_pieces: str = param("first", "content: which tokens of a content word the forget term suppresses and its "
                                    "targets ban: every one, or its first (\"first\": a word the model cannot begin "
                                    "is not said; its later pieces, which a small vocabulary shares with other "
                                    "words, stay as theta_0 has them); every token of a number either way",
                             choices=("all", "first"))
    # Issue 28: a single-digit tokenizer spells a year 1-9-x-x, and "all" suppresses the "19" of every erased birth
    # year too. "own" is not the default: on the sequential fixture it changed no figure beyond a run's own spread
    # (authors 186-187: utility 0.964 against 0.98, retain EM 0.99 against 0.98) and the customer benchmark has not
    # run with it.
    number_tokens: str = param("all", "content: which tokens of a content number the forget term suppresses: every "
                                      "one, or its own part (\"own\": from the first token the record makes at "
                                      "least e times likelier than a draft about someone else does, given the digits "
                                      "before it, to its end; the \"19\" of a year any context predicts stays as "
                                      "theta_0 has it)",
                               choices=("all", "own"))
    lambda_target: float = param(1.0, "content: weight of KL(q_t || pi_theta), q_t each token's destination", ge=0)
    greedy_margin: float = param(1.0, "logits by which some token of each content span (of each whole record, "
                                      "end of sequence aside) must trail the argmax before greedy decoding counts "
                                      "as not saying it (rounding in the saved dtype cannot flip it back; a "
                                      "token under 5 % probability never counts)", ge=0)
    content_max_probability: float = param(0.01, "the rule: no content span may still be sampled whole (given the "
                                                 "text before it) more often", gt=0, lt=1)
    rho_content: float = param(0.01, "a content token's restricted-probability target (its hinge's rho)", gt=0, lt=1)
    replay_every: int = param(20, "content: steps between refreshes of the model's own answers to forget prompts "
                                  "(greedy to the prompt and to its paraphrase, one sample)", ge=0, note="0: off")
    # Generation is what replays cost: 32 records a refresh spent more than half of a mini-TOFU run answering.
    replay_records: int = param(8, "open forget records whose prompts are answered at each refresh (every record "
                                   "is answered once at the start and at each confirmation); more, up to a fifth of "
                                   "the forget set, where that many are held open by their answers alone",
                                ge=1, le=4096)
    # Issue 28: a coalesced run's confirmations each found about 3 of 120 closed records failing again, a different
    # few each time: a closed record is trained no more, and its greedy answer drifts while the others train. Pinned
    # from the first failed confirmation, three pairs fired 55 steps after it instead of at the 23rd (BENCHMARKS.md).
    pin_answers: int = param(4, "content: once a confirmation has failed, clean greedy answers of closed records "
                                "that ride along each step (those ridden longest ago first), each token kept the "
                                "argmax by keep_gap logits with weight lambda_keep: a record once clean keeps its "
                                "answer while the others train", ge=0, le=4096, note="0: off")
    # Issue 28: greedy answers alone let partial numbers through ("+35 726 9280862" for "+30 726 9280862": the first
    # digits suppressed, the rest said after them), which the audit's ten samples per prompt found.
    confirm_samples: int = param(32, "the rule: samples (temperature 1) per forget prompt drawn from the model as it "
                                     "will be saved once everything else passes; a record any of whose samples gives "
                                     "back 4 or more digits in a row of one of its content numbers (that no kept "
                                     "record says) stays open, and that sample is trained on", ge=0, le=256,
                                 note="0: off")
    # Issue 28: a llama run of the customer benchmark stopped clean in its saved copy while its 4-bit copy said a
    # phone number, which the audit's quantized channel reads.
    confirm_quantized: bool = param(True, "content: the rule also asks the copy it would save, held at 4 bits as the "
                                          "audit's quantized channel holds it (NF4 on CUDA, int4 round-to-nearest "
                                          "elsewhere), for greedy answers once everything else passes; a record whose "
                                          "4-bit answer says its own content stays open")
    # Sampling: retain batches lean towards the forget set's nearest neighbours (lethe.engine.methods.masc.neighbours).
    retain_batch_size: int = param(0, "retain records per step", ge=0, le=4096, note="0: batch_size")
    neighbour_share: float = param(0.5, "share of retain rows drawn from the forget set's nearest neighbours",
                                   ge=0, le=1)
    neighbour_fraction: float = param(0.25, "the nearest neighbours: this top share of retain records by "
                                            "similarity", gt=0, le=1)
    # Issue 28: every run of a stream wore down what no retain record holds (lethe.engine.methods.masc.own_text).
    own_text_samples: int = param(0, "texts the start model writes before training (seeded, temperature 1, after "
                                       "the retain records' shared opening), less those that say a word only the "
                                       "forget records say; retain batches draw own_text_share of their rows from "
                                       "them, so the retain term also keeps what no retain record holds", ge=0,
                                  le=4096, note="0: off (the default: see the README); no retain records: off")
    own_text_share: float = param(0.25, "share of retain rows drawn from the own-text samples", ge=0, le=1)
    own_text_tokens: int = param(64, "tokens each own-text sample writes at most", ge=2, le=1024)
    # The online stop rule (lethe.engine.methods.masc.stop_rule): V <= alpha, and per record v_i <= c_i and no greedy
    # reproduction.
    alpha: float | str = param("auto", "the rule's target for V = mean_i v_i; \"auto\": calibrated on theta_0's "
                                       "violation rate on unseen text of the same shape", gt=0, lt=1, auto=True)
    record_ceiling: float | str = param("auto", "per-record ceiling c_i on v_i; \"auto\": theta_0's v on "
                                                "counterfactuals of the record", gt=0, le=1, auto=True)
    check_every: int = param(5, "optimiser steps between checks of the rule", ge=1)
    trigger_size: int = param(8, "holdout mode: records sampled by the trigger", ge=1)
    confirm_size: int = param(0, "records of D_val a confirmation measures", ge=0,
                              note="0: every record, which the per-record condition needs")
    val_mode: str = param("train", "D_val: \"train\" = every forget record trained and checked; \"holdout\" = "
                                   "the paper's generalisation study (a seeded sample kept out of training)",
                          choices=("train", "holdout"))
    holdout_fraction: float = param(0.1, "holdout mode: share of the forget set kept out", gt=0, lt=1)
    holdout_min: int = param(4, "holdout mode: fewest records kept out (and kept for training)", ge=1)
    hoeffding: bool = param(False, "holdout mode: stop on the Hoeffding upper bound of V over the held-out records "
                                   "instead of V itself")
    hoeffding_delta: float = param(0.05, "confidence of the Hoeffding bound (spent over the confirmations)",
                                   gt=0, lt=1)
    # The pace the escalation aims at, and room past it for a run the ceiling holds back (issue 28).
    pace_steps: int = param(1000, "with content suppression lambda_forget also doubles when the pace of the last "
                                  "escalate_after checks would not make the rule fire by this step",
                            ge=1, le=1_000_000)
    max_steps: int = param(2000, "a safety cap only: the rule decides the length (a run that hits it is flagged)",
                           ge=1, le=1_000_000)
    # Issue 28: whitened full fine-tuning wore a quarter of LoRA's margin per unit of erasure on the facts no retain
    # term holds (BENCHMARKS.md, "Whitened updates"), so the default ("auto") takes it where it fits, LoRA where it
    # does not (no retain records, sharded, or too big); the published presets keep SPEC section 3's LoRA.
    lora: bool | str = param("auto", "train LoRA adapters (theta_0 = adapters off, no second copy); false: full "
                                   "fine-tuning with a frozen copy; \"auto\": full fine-tuning with whitened updates "
                                   "(whiten_updates) where the run has retain records, runs in one process and its "
                                   "memory plan fits the device, else LoRA", choices=(True, False, "auto"))
    # Optimisation: a constant lr, since the stop rule, not a schedule, decides the length.
    lr: float = param(1e-4, "AdamW learning rate (constant: the rule decides the length)", gt=0, le=1)

    @classmethod
    def from_dict(cls, values: dict | None = None, preset: str | None = None) -> MascParams:
        """Preset values first, then explicit ones; unknown names and bad values raise."""
        return parse_params(cls, "masc", values, preset, PRESETS)

    def check(self) -> None:
        super().check()
        for name in ("lambda_keep", "lambda_logits"):
            self.need(getattr(self, name) in ("auto", 0) or self.retain_loss == "kl", name,
                      "needs retain_loss \"kl\" (it is part of that term)")
        # In train mode D_val is the trained records themselves, not a sample of a population: a confidence bound on
        # their mean would state a guarantee it does not have (issue 25).
        self.need(not self.hoeffding or self.val_mode == "holdout", "hoeffding",
                  "needs val_mode \"holdout\": the bound is over records drawn from the forget population and kept "
                  "out of training; in train mode the rule measures every record itself")

    def margin(self) -> dict[str, float]:
        """The restricted margin that defines V and the hinge, for a connectivity curve of this job."""
        return {"k": self.k, "rho": self.rho, "eta": self.eta, "beta": self.beta}

    @property
    def tau(self) -> float:
        return math.log(self.rho / (1 - self.rho))

    @property
    def tau_content(self) -> float:
        return math.log(self.rho_content / (1 - self.rho_content))

    @property
    def content(self) -> bool:
        """Whether the run suppresses each record's content (with destinations and replays) or whole records."""
        return self.suppress == "content"

    @property
    def keep_weight(self) -> float:
        """lambda_keep once resolved (see resolved)."""
        return _number(self.lambda_keep, "lambda_keep")

    @property
    def logits_weight(self) -> float:
        """lambda_logits once resolved (see resolved)."""
        return _number(self.lambda_logits, "lambda_logits")

    @property
    def retain_weight(self) -> float:
        """lambda_retain once resolved (see resolved)."""
        return _number(self.lambda_retain, "lambda_retain")

    def resolved(self) -> MascParams:
        """lambda_retain "auto": 3 with content suppression, else 1; lambda_keep "auto": 3 and lambda_logits "auto":
        8 with content suppression and the KL retain term, else 0. alpha and record_ceiling stay: calibration
        measures them on theta_0."""
        held = self.content and self.retain_loss == "kl"  # the terms that ride on the KL retain term
        keep = (3.0 if held else 0.0) if self.lambda_keep == "auto" else self.lambda_keep
        logits = (8.0 if held else 0.0) if self.lambda_logits == "auto" else self.lambda_logits
        retain = (3.0 if self.content else 1.0) if self.lambda_retain == "auto" else self.lambda_retain
        return dataclasses.replace(self, lambda_retain=retain, lambda_keep=keep, lambda_logits=logits)


# The published method suppresses every token of a record: no destination, no replay, no margin on the greedy check.
AS_PUBLISHED = dict(suppress="whole", lambda_keep=0.0, lambda_logits=0.0, greedy_margin=0.0, lora=True)
# Published defaults (SPEC section 3). lr and batch are given for TOFU only; the others keep ours.
PRESETS: dict[str, dict] = {
    "qwen2.5-scaling": dict(lambda_forget=0.1, lambda_retain=1.0, rho=0.5, eta=0.5, k=10, beta=1.0,
                            alpha=0.2, alternatives="self", **AS_PUBLISHED),
    # The official TOFU run: cross-entropy retain term with weight 0 (no retain term at all).
    "tofu-llama2": dict(lambda_forget=0.05, lambda_retain=0.0, retain_loss="nll", rho=0.7, eta=0.25, k=10, beta=1.0,
                        alpha=0.475, lr=1e-4, batch_size=2, alternatives="self", **AS_PUBLISHED),
    "muse-news": dict(alternatives="teacher", k=2, delta=0.5, beta=5.0, rho=0.7, eta=0.5, lambda_retain=1.0,
                      lambda_forget=0.5, alpha=0.55, **AS_PUBLISHED),
    # The paper's suppression, every token of every record, retain KL weighted 1, with our per-record rule.
    "whole-record": dict(lambda_retain=1.0, **AS_PUBLISHED),
    # Issue 28, the escalation. "gentle": the defaults' ceiling 0.1, its pace aimed at 2,000 steps (one request of
    # the sequential benchmark: fired at 1,605 steps, retain EM 0.99, model utility 0.963 of 1.0 and 0.998; the
    # defaults: 1,980 steps, 0.99, 0.963). "fast": the defaults before, up to 1 within 1,000 steps: sooner where the
    # rule stalls, at a cost (805 steps, 0.65, 0.859).
    "gentle": dict(lambda_forget_max=0.1, pace_steps=2000, max_steps=2000),
    "fast": dict(lambda_forget_max=1.0, pace_steps=1000, max_steps=1000),
}
