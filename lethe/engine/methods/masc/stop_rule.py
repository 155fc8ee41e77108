"""MASC's online stop rule (SPEC section 3) with a per-record erasure condition.

The rule stops at the first confirmation where, measured on every record of D_val,

    V = mean_i v_i <= alpha                      (the mean, as in the MASC paper; or its Hoeffding bound)
    and, for every record i:  v_i <= c_i         (no record more dominant than text it never saw)
                       and    r_i = 0            (greedy decoding does not give the record back)
                       and    p_i <= p_max       (no content span of it is sampled whole with probability > p_max)
                       and    g_i = 0            (nor greedy-decoded whole, given the text before it)
                       and    l_i = 0            (its own greedy answers, to the prompt and to the paraphrase,
                                                  give back no content of a forget record
                                                  of its request: another record's single
                                                  word only where tied to its subject)
                       and    o_i = 0            (and do not loop), except for at most floor(n q) records
                                                 that fail by a loop alone

q is the chance that a model that never saw a record loops where theta_0's own loops (on the record's prompt, or on
the same question about someone else) do not excuse it: the share of records whose answers theta_0 loops on a second
question about someone else. Loops are chance on small models (mini-TOFU's retrain reference loops in 11 of 120
records); a condition that no record may loop asks more of the erasure than of a model that never saw the records.

Where a record's content is located (suppress "content"), its content conditions replace both its
ceiling and its share in the mean: such a record keeps its template as dominant as any model would, so
its v_i stays near the template's share by design, and a mean that counts it hovers at alpha and lets
a finished run train on to max_steps (issue 11). V is then the mean over the records suppressed whole,
and vacuous when there are none.

v_i is the share of record i's active tokens with a restricted margin above tau; c_i its ceiling
(lethe.engine.methods.masc.calibration); r_i = 1 when every active token but the end of sequence is said greedily under
teacher forcing (the argmax, or within greedy_margin logits of it), which holds whenever greedy decoding
reproduces the record's words (flipping the end-of-sequence token alone leaves them all said). A mean can pass
while one record is still reproduced; the per-record terms make that impossible at the stop.

The rule only decides; the caller measures. `check` takes two callables so that scripted measurements
drive it exactly as the trainer's do.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

CONDITION = ("stop when V = mean_i v_i <= alpha and, for every forget record i, v_i <= c_i (its ceiling) and "
             "greedy decoding does not reproduce it (some active token is not the argmax)")
CONTENT_CONDITION = ("stop when, for every forget record i, greedy decoding does not reproduce its words (the end "
                     "of sequence aside, within greedy_margin logits); where its content is located, no content "
                     "span is said whole with probability above its limit, none is greedy-decoded given the text "
                     "before it (within greedy_margin), and the model's own greedy answers to its prompt and to its "
                     "paraphrased prompt give back no content of a forget record of its request (every forget "
                     "record, unless they name their requests; another record's single word only where the model "
                     "says it more about the record's subject than about others, by min_gain nats) and do not loop "
                     "(except for as many records as a model that never saw them loops on, by chance: floor(n q)) "
                     "(these replace its ceiling and its "
                     "share in the mean); elsewhere v_i <= c_i, and V = the mean of v_i over those "
                     "records <= alpha; checked again on the merged checkpoint in its saved dtype, where also "
                     "none of confirm_samples samples (temperature 1) of its answer to its prompt gives back 4 or "
                     "more digits in a row of one of its content numbers that no kept record says")

FAILING_IDS_SHOWN = 20  # a trace entry names at most this many failing records (and counts them all)
TOLERANCE = 1e-6  # a float32 share against a target computed in float64 another way (10/17 against 1 - 7/17)


@dataclass(frozen=True)
class RecordCheck:
    id: str
    violation: float  # v_i
    active_tokens: int  # L_i
    reproduced: bool  # greedy decoding gives back every active token
    hinge: float = 0.0  # the record's mean buffered hinge: how far its tokens still are from suppressed
    secret_probability: float = 0.0  # the largest p(secret | the text before it) over its secrets
    secret_greedy: bool = False  # some secret greedy-decoded whole, given the text before it
    leaked: bool = False  # the model's own greedy answer gave content back (read at replays and confirmations)
    looped: bool = False  # the model's own greedy answer loops


@dataclass
class ErasureCondition:
    """The per-record part of the rule. `ceilings`: c_i by record id (a record without one has none);
    `secret_max`: the largest probability a secret may keep of being said whole; `secret_ids`: records
    whose secrets are located, for which the secret conditions replace the ceiling (their template is
    meant to stay as dominant as in any model, so v_i says little about them)."""
    ceilings: dict[str, float]
    secret_max: float = 1.0
    secret_ids: frozenset[str] = frozenset()
    secret_priors: dict[str, float] = field(default_factory=dict)  # per record: a limit above secret_max
    # Per record: the chance that a model that never saw it loops where theta_0's own loops do not excuse it
    # (Replays.start). Loops that many records show are chance, not the erasure's: see loop_allowance.
    loop_chance: float = 0.0
    requests: dict[str, str] = field(default_factory=dict)  # record id -> its request in a coalesced run

    def secret_limit(self, rid: str) -> float:
        """secret_max, or the share of retain answers that say the secret when higher: a model that never
        saw the record says a common occupation that often."""
        return max(self.secret_max, self.secret_priors.get(rid, 0.0))

    def why(self, check: RecordCheck, headroom: float = 1.0) -> list[str]:
        """The parts of the condition this check fails, by name (empty: it holds); `headroom` < 1 holds a content
        span's probability to that share of its limit (the stricter target training aims at, see the stop policy)."""
        return list(self._failures(check, headroom))

    def holds(self, check: RecordCheck, headroom: float = 1.0) -> bool:
        return next(self._failures(check, headroom), None) is None  # the first failing part decides: a hot path

    def _failures(self, check: RecordCheck, headroom: float) -> Iterator[str]:
        if check.reproduced:
            yield "reproduced"
        if check.secret_greedy:
            yield "secret_greedy"
        if check.leaked:
            yield "leaked"
        if check.looped:
            yield "looped"
        if check.secret_probability > headroom * self.secret_limit(check.id):
            yield "secret_probability"
        if check.id not in self.secret_ids and check.violation > self.ceilings.get(check.id, 1.0) + TOLERANCE:
            yield "ceiling"

    def loop_allowance(self, n: int) -> int:
        """How many of n records may fail by a loop alone: the count a model that never saw them shows on average,
        floor(n * loop_chance). Without it a union of many records almost never passes: each fresh answer loops by
        chance, so all n answers are fluent at once with odds (1 - loop_chance)^n (mini-TOFU's retrain reference
        loops in 11 of 120 records that theta_0's loops do not excuse)."""
        return math.floor(n * self.loop_chance + TOLERANCE)

    def loop_allowances(self, record_ids: list[str]) -> dict[str | None, int]:
        """Each request's allowance over these records (None: the run's one request)."""
        sizes: dict[str | None, int] = {}
        for rid in record_ids:
            sizes[self.requests.get(rid)] = sizes.get(self.requests.get(rid), 0) + 1
        return {request: self.loop_allowance(n) for request, n in sizes.items()}

    def loops_within_chance(self, checks: list[RecordCheck]) -> list[str]:
        """The records that fail by a loop alone and are within the allowance of their request (a coalesced run's
        requests each have their own, so that each request's verdict stands on its own records): the first
        loop_allowance(n) of them in the order given (which ones does not matter: the allowance counts records)."""
        if self.loop_chance <= 0:
            return []
        left = self.loop_allowances([c.id for c in checks])
        excused = []
        for c in checks:
            request = self.requests.get(c.id)
            if left[request] and c.looped and self.why(c) == ["looped"]:
                left[request] -= 1
                excused.append(c.id)
        return excused

    def failing(self, checks: list[RecordCheck]) -> list[str]:
        excused = set(self.loops_within_chance(checks))
        return [c.id for c in checks if not self.holds(c) and c.id not in excused]

    def failing_why(self, checks: list[RecordCheck]) -> dict[str, int]:
        """How many records fail each part of the condition (a record failing two counts in both; loops within
        chance apart): a failed confirmation's trace says whether answers or teacher-forced measurements held the run
        open."""
        excused = set(self.loops_within_chance(checks))
        counts: dict[str, int] = {"looped_within_chance": len(excused)} if excused else {}
        for check in checks:
            for name in ([] if check.id in excused else self.why(check)):
                counts[name] = counts.get(name, 0) + 1
        return counts

    def judged(self, checks: list[RecordCheck]) -> list[RecordCheck]:
        """The records whose v_i the mean counts: those without located secrets."""
        return [c for c in checks if c.id not in self.secret_ids]


class RecordStates:
    """The latest check of every record of D_val, and their mean, kept current in O(1) per update."""

    def __init__(self, checks: list[RecordCheck]):
        self.by_id = {c.id: c for c in checks}
        self.total = sum(c.violation for c in checks)

    def update(self, checks: list[RecordCheck]) -> None:
        for c in checks:
            self.total += c.violation - self.by_id[c.id].violation
            self.by_id[c.id] = c

    def mean(self) -> float:
        return self.total / len(self.by_id)

    def __getitem__(self, rid: str) -> RecordCheck:
        return self.by_id[rid]

    def all(self) -> list[RecordCheck]:
        return list(self.by_id.values())


def hoeffding_bound(v: float, n: int, delta: float, j: int) -> float:
    """Upper confidence bound V + sqrt(log(1/delta_j) / 2n), delta_j = 6 delta / (pi^2 j^2)."""
    return v + hoeffding_slack(n, delta, j)


def hoeffding_slack(n: int, delta: float, j: int) -> float:
    delta_j = 6 * delta / (math.pi ** 2 * j ** 2)
    return math.sqrt(math.log(1 / delta_j) / (2 * n))


def mean_violation(checks: list[RecordCheck]) -> float:
    return sum(c.violation for c in checks) / len(checks)


@dataclass
class OnlineStopRule:
    alpha: float
    check_every: int
    hoeffding: bool = False
    delta: float = 0.05
    condition: ErasureCondition | None = None  # None: the mean alone (holdout mode, as in the paper)
    trace: list[dict] = field(default_factory=list)
    confirmations: int = 0
    last_confirmed: list[RecordCheck] | None = None

    def due(self, step: int) -> bool:
        return step % self.check_every == 0

    @property
    def latest_v(self) -> float | None:
        return self.trace[-1]["v"] if self.trace else None

    def mean_target(self, n: int) -> float:
        """The V the mean must reach: alpha, less the Hoeffding slack of the next confirmation."""
        if not self.hoeffding:
            return self.alpha
        return self.alpha - hoeffding_slack(n, self.delta, self.confirmations + 1)

    def judged(self, checks: list[RecordCheck]) -> list[RecordCheck]:
        """The records the mean counts: those the condition judges by v_i (all of them without a condition)."""
        return self.condition.judged(checks) if self.condition else checks

    def judged_mean(self, checks: list[RecordCheck]) -> float | None:
        """The V compared with alpha; None when no record counts (every record decided by its secrets)."""
        judged = self.judged(checks)
        return mean_violation(judged) if judged else None

    def passes(self, checks: list[RecordCheck]) -> tuple[bool, float, list[str]]:
        v, judged = mean_violation(checks), self.judged_mean(checks)
        failing = self.condition.failing(checks) if self.condition else []
        return (judged is None or judged <= self.alpha + TOLERANCE) and not failing, v, failing

    def check(self, step: int, trigger: Callable[[], list[RecordCheck]],
              confirm: Callable[[], list[RecordCheck]]) -> bool:
        """A cheap trigger (a sample, or the latest per-record measurements); when it passes, a
        confirmation on all of D_val. True: stop here."""
        sample = trigger()
        ok, v, failing = self.passes(sample)
        self.trace.append(_entry(step, "trigger", v, len(failing), failing, ok, n=len(sample)))
        if not ok:
            return False
        checks = confirm()
        self.confirmations += 1
        self.last_confirmed = checks
        v, counted = mean_violation(checks), self.judged(checks)
        judged = mean_violation(counted) if counted else None
        failing = self.condition.failing(checks) if self.condition else []
        statistic = (hoeffding_bound(judged, len(counted), self.delta, self.confirmations)
                     if self.hoeffding and judged is not None else judged)
        passed = (statistic is None or statistic <= self.alpha + TOLERANCE) and not failing
        entry = _entry(step, "confirm", v, len(failing), failing, passed, n=len(checks))
        if failing and self.condition:
            entry["failing_why"] = self.condition.failing_why(checks)
        if judged != v:
            entry["v_judged"] = judged  # the mean over the records judged by v_i (see the module's docstring)
        if self.hoeffding:
            entry["upper_bound"] = statistic
        self.trace.append(entry)
        return passed


def _entry(step: int, stage: str, v: float, n_failing: int, failing: list[str], passed: bool, n: int) -> dict:
    entry = {"step": step, "stage": stage, "v": v, "n": n, "passed": passed, "failing_records": n_failing}
    if failing:
        entry["failing_ids"] = failing[:FAILING_IDS_SHOWN]
    return entry
