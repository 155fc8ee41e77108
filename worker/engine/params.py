"""MASC parameters, their validation, and the named presets of SPEC section 3."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from worker.engine.baseline_params import BASELINES, BaselineParams
from worker.engine.errors import EngineInputError
from worker.engine.param_base import SharedParams, _number, auto_or


@dataclass
class MascParams(SharedParams):
    # The objective (SPEC section 3).
    alternatives: str = "self"  # "self" or "teacher"
    k: int = 10
    beta: float = 1.0
    rho: float = 0.5
    eta: float = 0.5
    delta: float = 0.5  # teacher mode: keep alternatives within delta logits of theta_0's best
    lambda_forget: float = 0.01  # measured: 0.1 (the paper's) costs neighbours on models of 1-4 M parameters
    escalate_after: int = 10  # checks without progress before lambda_forget doubles (up to 1); 0: never. With
    # secret_focus also when too slow for max_steps, up to max(1, lambda_retain) (worker.engine.schedule)
    # "auto": 3 where secret focus runs (it kept retain exact match on the customer benchmark, issue 11), else 1.
    lambda_retain: float | str = "auto"
    retain_loss: str = "kl"  # "kl" (KL(pi_0 || pi_theta)) or "nll"
    # With the KL retain term: also keep each retain token's argmax gap as theta_0 had it, up to keep_gap
    # logits (worker.engine.margin.kept_argmax_hinge), weighted lambda_keep inside the retain term. 0: off.
    # "auto": 3 with secret_focus and the KL retain term (measured: 3 kept retain EM >= 0.976 on the customer
    # benchmark where 1 let it fall to 0.929, issue 11); 0 otherwise (whole records, as published, or "nll",
    # which has no theta_0 to keep gaps from).
    lambda_keep: float | str = "auto"
    keep_gap: float = 2.0
    # Secrets (worker.engine.secret_spans): take the secret's tokens out and keep the rest of the answer at
    # theta_0 (fluent); off: every token of every record is suppressed, as in the paper (preset
    # "whole-record"); true: every record, its secrets given or extracted (preset "secret-focus").
    # "auto": on for the records whose request names their `secrets`, the others suppressed whole. Named
    # secrets are exactly what must not come out: on the customer benchmark focus leaks nothing and loops
    # <= 8 % where whole records leak 2 of 12 and loop 8-25 %. Extracted ones are a guess that covers about
    # half of a prose answer: on mini-TOFU focusing on them ran to max_steps and kept retain exact match
    # 0.660 against 0.990 (BENCHMARKS.md, issue 11). A record with no located secret is suppressed whole.
    secret_focus: bool | str = "auto"
    secret_max_probability: float = 0.01  # the rule: no secret may still be sampled whole more often
    # a secret token's restricted probability target (>= its probability): <= secret_max_probability
    rho_secret: float = 0.01
    lambda_fluency: float = 1.0  # KL(pi_0 || pi_theta) on the forget answers' other tokens
    # KL(theta_0 without the secret token || pi_theta) at secret tokens. "auto": 3 (as the preset "secret-focus").
    lambda_redistribute: float | str = "auto"
    replay_every: int = 25  # steps between refreshes of the model's own answers to forget prompts (0: off)
    replay_records: int = 32  # forget prompts answered at each refresh
    # Sampling: retain batches lean towards the forget set's nearest neighbours (worker.engine.neighbours).
    retain_batch_size: int = 0  # 0: batch_size
    neighbour_share: float = 0.5  # share of retain rows drawn from the nearest neighbours
    neighbour_fraction: float = 0.25  # the nearest neighbours: this top share of retain records by similarity
    # The online stop rule (worker.engine.stop_rule): V <= alpha, and per record v_i <= c_i and no greedy
    # reproduction. "auto": calibrated on theta_0's behaviour on unseen text of the same shape.
    alpha: float | str = "auto"
    record_ceiling: float | str = "auto"
    check_every: int = 5
    trigger_size: int = 8  # holdout mode: records sampled by the trigger
    confirm_size: int = 0  # 0: confirm on every record of D_val (needed for the per-record condition)
    val_mode: str = "train"  # "train": every forget record trained and checked; "holdout": the paper's study
    holdout_fraction: float = 0.1
    holdout_min: int = 4
    hoeffding: bool = False
    hoeffding_delta: float = 0.05
    max_steps: int = 1000  # a safety cap only: the rule decides the length
    # Optimisation (constant lr: the stop rule, not a schedule, decides the length).
    lr: float = 1e-4
    weight_decay: float = 0.0

    @classmethod
    def from_dict(cls, values: dict | None = None, preset: str | None = None) -> MascParams:
        """Preset values first, then explicit ones; unknown names and bad values raise."""
        merged: dict = {}
        if preset is not None:
            if preset not in PRESETS:
                raise EngineInputError(
                    f"unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))}",
                    field="preset")
            merged.update(PRESETS[preset])
        merged.update(values or {})
        return cls._build(merged)

    def validate(self) -> None:
        super().validate()
        need = self.need
        need(auto_or(self.alpha, lambda v: 0 < v < 1), "alpha", "must be \"auto\" or lie in (0, 1)")
        need(auto_or(self.record_ceiling, lambda v: 0 < v <= 1), "record_ceiling",
             "must be \"auto\" or lie in (0, 1]")
        need(0 <= self.retain_batch_size <= 4096, "retain_batch_size", "must lie in [0, 4096] (0: batch_size)")
        need(0 <= self.neighbour_share <= 1, "neighbour_share", "must lie in [0, 1]")
        need(0 < self.neighbour_fraction <= 1, "neighbour_fraction", "must lie in (0, 1]")
        need(0 < self.rho < 1, "rho", "must lie in (0, 1)")
        need(0 < self.secret_max_probability < 1, "secret_max_probability", "must lie in (0, 1)")
        need(0 < self.rho_secret < 1, "rho_secret", "must lie in (0, 1)")
        need(self.lambda_fluency >= 0, "lambda_fluency", "must be >= 0")
        need(auto_or(self.lambda_redistribute, lambda v: v >= 0), "lambda_redistribute",
             "must be \"auto\" or >= 0")
        need(self.secret_focus in (True, False, "auto"), "secret_focus", "must be true, false or \"auto\"")
        need(self.replay_every >= 0, "replay_every", "must be >= 0 (0: off)")
        need(1 <= self.replay_records <= 4096, "replay_records", "must lie in [1, 4096]")
        need(1 <= self.k <= 4096, "k", "must lie in [1, 4096]")
        need(self.beta > 0, "beta", "must be > 0")
        need(self.eta > 0, "eta", "must be > 0")
        need(self.delta >= 0, "delta", "must be >= 0")
        need(self.alternatives in ("self", "teacher"), "alternatives", "must be 'self' or 'teacher'")
        need(self.retain_loss in ("kl", "nll"), "retain_loss", "must be 'kl' or 'nll'")
        need(self.lambda_forget > 0, "lambda_forget", "must be > 0")
        need(self.escalate_after >= 0, "escalate_after", "must be >= 0 (0: never)")
        need(auto_or(self.lambda_retain, lambda v: v >= 0), "lambda_retain", "must be \"auto\" or >= 0")
        need(auto_or(self.lambda_keep, lambda v: v >= 0), "lambda_keep", "must be \"auto\" or >= 0 (0: off)")
        need(self.lambda_keep in ("auto", 0) or self.retain_loss == "kl", "lambda_keep",
             "needs retain_loss \"kl\" (it is part of that term)")
        need(self.keep_gap > 0, "keep_gap", "must be > 0")
        need(self.check_every >= 1, "check_every", "must be >= 1")
        need(self.trigger_size >= 1, "trigger_size", "must be >= 1")
        need(self.confirm_size >= 0, "confirm_size", "must be >= 0 (0: all of D_val)")
        need(self.val_mode in ("holdout", "train"), "val_mode", "must be holdout or train")
        need(0 < self.holdout_fraction < 1, "holdout_fraction", "must lie in (0, 1)")
        need(self.holdout_min >= 1, "holdout_min", "must be >= 1")
        need(0 < self.hoeffding_delta < 1, "hoeffding_delta", "must lie in (0, 1)")
        need(1 <= self.max_steps <= 1_000_000, "max_steps", "must lie in [1, 1000000]")
        need(0 < self.lr <= 1, "lr", "must lie in (0, 1]")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")

    @property
    def tau(self) -> float:
        return math.log(self.rho / (1 - self.rho))

    @property
    def tau_secret(self) -> float:
        return math.log(self.rho_secret / (1 - self.rho_secret))

    @property
    def keep_weight(self) -> float:
        """lambda_keep resolved: "auto" is 3 with secret_focus and the KL retain term, else 0."""
        if self.lambda_keep == "auto":
            return 3.0 if self.secret_focus is True and self.retain_loss == "kl" else 0.0
        return float(self.lambda_keep)

    @property
    def retain_weight(self) -> float:
        """lambda_retain once resolved (see resolved)."""
        return _number(self.lambda_retain, "lambda_retain")

    @property
    def redistribute_weight(self) -> float:
        """lambda_redistribute once resolved (see resolved)."""
        return _number(self.lambda_redistribute, "lambda_redistribute")

    def resolved(self, focused: bool) -> MascParams:
        """The parameters a run uses, every "auto" of secret focus decided: `focused` says whether focus
        runs on some record (secret_focus true, or "auto" with named secrets). lambda_keep stays "auto"
        (keep_weight reads the resolved secret_focus)."""
        focus = self.secret_focus is True or (self.secret_focus == "auto" and focused)
        return dataclasses.replace(
            self, secret_focus=focus,
            lambda_retain=(3.0 if focus else 1.0) if self.lambda_retain == "auto" else self.lambda_retain,
            lambda_redistribute=3.0 if self.lambda_redistribute == "auto" else self.lambda_redistribute)



# The published method suppresses every token of a record: no secret focus, no fluency term.
AS_PUBLISHED = dict(secret_focus=False, lambda_fluency=0.0, lambda_redistribute=0.0, lambda_keep=0.0)
# Published defaults (SPEC section 3). lr and batch are given for TOFU only; the others keep ours.
PRESETS: dict[str, dict] = {
    "qwen2.5-scaling": dict(lambda_forget=0.1, lambda_retain=1.0, rho=0.5, eta=0.5, k=10, beta=1.0,
                            alpha=0.2, alternatives="self", **AS_PUBLISHED),
    # The official TOFU run: cross-entropy retain term with weight 0 (no retain term at all).
    "tofu-llama2": dict(lambda_forget=0.05, lambda_retain=0.0, retain_loss="nll", rho=0.7, eta=0.25, k=10, beta=1.0,
                        alpha=0.475, lr=1e-4, batch_size=2, alternatives="self", **AS_PUBLISHED),
    "muse-news": dict(alternatives="teacher", k=2, delta=0.5, beta=5.0, rho=0.7, eta=0.5, lambda_retain=1.0,
                      lambda_forget=0.5, alpha=0.55, **AS_PUBLISHED),
    # The paper's suppression: every token of every record, retain KL weighted 1 (what the default does where
    # the request names no secrets).
    "whole-record": dict(lambda_retain=1.0, **AS_PUBLISHED),
    # Ours, not published (issue 11): only the secrets go, the answer stays fluent (loops in its own answers
    # suppressed); the secret's mass moved harder; retain tokens kept as far ahead as theta_0 had them. Meets
    # the targets on the customer benchmark; on mini-TOFU, with extracted secrets, it cost retain
    # (BENCHMARKS.md). What the default does where the request names secrets, here also for extracted ones.
    "secret-focus": dict(secret_focus=True, lambda_retain=3.0, lambda_redistribute=3.0, lambda_keep="auto"),
}


def params_for(method: str, values: dict | None = None, preset: str | None = None):
    """The parameters of any method by name: MascParams (with presets) or BaselineParams."""
    if method == "masc":
        return MascParams.from_dict(values, preset=preset)
    if method not in BASELINES:
        raise EngineInputError(f"unknown method {method!r}; known: masc, {', '.join(BASELINES)}", field="method")
    if preset is not None:
        raise EngineInputError(f"presets are MASC's; method {method} takes its field defaults", field="preset")
    return BaselineParams.from_dict(method, values)
