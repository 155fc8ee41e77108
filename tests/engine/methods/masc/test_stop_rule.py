"""The online stop rule driven by scripted measurements: the mean, the per-record condition, Hoeffding."""
import math

import pytest

from lethe.engine.methods.masc.stop_rule import (
    ErasureCondition,
    OnlineStopRule,
    RecordCheck,
    hoeffding_bound,
    mean_violation,
)


def records(*violations, reproduced=()):
    """RecordChecks r0, r1, ... with the given v_i (10 active tokens each); `reproduced`: their indices."""
    return [RecordCheck(f"r{i}", v, 10, i in reproduced) for i, v in enumerate(violations)]


def uniform(v, n=50):
    return records(*([v] * n))


def drive(rule, triggers, confirms, max_steps=100):
    """Step like the trainer: check when due, stop on the rule or at max_steps."""
    triggers, confirms = iter(triggers), iter(confirms)
    calls = {"confirm": 0}

    def confirm():
        calls["confirm"] += 1
        return next(confirms)

    step = 0
    while True:
        if rule.due(step) and rule.check(step, lambda: next(triggers), confirm):
            return "alpha", step, calls["confirm"]
        if step >= max_steps:
            return "max_steps", step, calls["confirm"]
        step += 1


def test_stops_at_first_confirmed_check_at_or_below_alpha():
    rule = OnlineStopRule(alpha=0.2, check_every=5)
    # trigger: high, high, passes (confirm fails), passes (confirm passes at exactly alpha)
    triggers = [uniform(v, 8) for v in (0.9, 0.5, 0.1, 0.2, 0.0)]
    reason, step, confirms = drive(rule, triggers, [uniform(0.3), uniform(0.2)])
    assert (reason, step, confirms) == ("alpha", 15, 2)
    assert [e["stage"] for e in rule.trace] == ["trigger", "trigger", "trigger", "confirm", "trigger", "confirm"]
    assert rule.trace[3]["passed"] is False and rule.trace[-1]["passed"] is True
    assert rule.latest_v == pytest.approx(0.2) and rule.trace[-1]["n"] == 50


def test_no_confirmation_while_the_trigger_is_above_alpha():
    rule = OnlineStopRule(alpha=0.2, check_every=1)
    reason, step, confirms = drive(rule, [uniform(0.21, 8)] * 11, [], max_steps=10)
    assert (reason, step, confirms) == ("max_steps", 10, 0)
    assert len(rule.trace) == 11  # checks at steps 0..10


def test_max_steps_is_a_safety_cap():
    rule = OnlineStopRule(alpha=0.2, check_every=4)
    reason, step, confirms = drive(rule, [uniform(0.1, 8)] * 10, [uniform(0.5)] * 10, max_steps=12)
    assert (reason, step, confirms) == ("max_steps", 12, 4)  # checks at 0, 4, 8, 12 all refuted


def test_a_mean_that_passes_does_not_stop_while_one_record_is_above_its_ceiling():
    # Mean 0.19 <= alpha 0.2, but r3 sits at 0.7 with ceiling 0.5: the mean hides it.
    ceilings = {f"r{i}": 0.5 for i in range(4)}
    rule = OnlineStopRule(alpha=0.2, check_every=1, condition=ErasureCondition(ceilings))
    hidden = records(0.02, 0.02, 0.02, 0.7)
    assert mean_violation(hidden) <= 0.2
    fixed = records(0.1, 0.1, 0.1, 0.45)
    reason, step, _ = drive(rule, [hidden, hidden, fixed], [fixed])
    assert (reason, step) == ("alpha", 2)
    assert rule.trace[0] == {"step": 0, "stage": "trigger", "v": pytest.approx(0.19), "n": 4, "passed": False,
                             "failing_records": 1, "failing_ids": ["r3"]}
    # Without the condition (the paper's rule) the same measurements stop at once.
    plain = OnlineStopRule(alpha=0.2, check_every=1)
    assert drive(plain, [hidden], [hidden])[:2] == ("alpha", 0)


def test_a_record_that_greedy_decoding_reproduces_blocks_the_stop_whatever_its_violation():
    condition = ErasureCondition({f"r{i}": 0.9 for i in range(3)})
    rule = OnlineStopRule(alpha=0.5, check_every=1, condition=condition)
    reproduced = records(0.0, 0.1, 0.2, reproduced=(0,))  # v = 0 yet every token is still the argmax
    assert condition.failing(reproduced) == ["r0"]
    reason, step, confirms = drive(rule, [reproduced, records(0.0, 0.1, 0.2), records(0.0, 0.1, 0.2)],
                                   [records(0.0, 0.1, 0.2, reproduced=(2,)), records(0.0, 0.1, 0.2)],
                                   max_steps=5)
    # step 1: the trigger passes, the confirmation finds r2 reproduced; step 2 stops.
    assert (reason, step, confirms) == ("alpha", 2, 2)
    confirm_entries = [e for e in rule.trace if e["stage"] == "confirm"]
    assert confirm_entries[0]["failing_ids"] == ["r2"] and confirm_entries[1]["passed"]
    assert confirm_entries[0]["failing_why"] == {"reproduced": 1} and "failing_why" not in confirm_entries[1]


def test_a_failed_confirmation_counts_each_part_of_the_condition_its_records_fail():
    from dataclasses import replace
    condition = ErasureCondition({"r0": 0.1, "r1": 0.1, "r2": 0.1, "r3": 0.1}, secret_max=0.5,
                                 secret_ids=frozenset({"r2"}))
    checks = records(0.5, 0.0, 0.9, 0.0, reproduced=(0,))
    checks[1] = replace(checks[1], leaked=True, looped=True)
    checks[2] = replace(checks[2], secret_probability=0.6)  # r2's v_i (0.9) is not judged: its content decides
    assert condition.why(checks[0]) == ["reproduced", "ceiling"] and condition.why(checks[3]) == []
    assert condition.failing_why(checks) == {"reproduced": 1, "ceiling": 1, "leaked": 1, "looped": 1,
                                             "secret_probability": 1}
    assert condition.failing(checks) == ["r0", "r1", "r2"]


def test_records_without_a_ceiling_are_held_to_no_reproduction_only():
    condition = ErasureCondition({"r0": 0.1})
    assert condition.failing(records(0.05, 0.99)) == []
    assert condition.failing(records(0.2, 0.99, reproduced=(1,))) == ["r0", "r1"]


def test_hoeffding_variant_requires_the_upper_bound_below_alpha():
    delta, n = 0.05, 400
    # j-th confirmation: bound = V + sqrt(log(pi^2 j^2 / (6 delta)) / 2n)
    expected = 0.1 + math.sqrt(math.log(math.pi ** 2 * 1 / (6 * delta)) / (2 * n))
    assert math.isclose(hoeffding_bound(0.1, n, delta, 1), expected)
    assert hoeffding_bound(0.1, n, delta, 2) > hoeffding_bound(0.1, n, delta, 1)  # delta_j shrinks
    rule = OnlineStopRule(alpha=0.2, check_every=1, hoeffding=True, delta=delta)
    # 0.15 passes the plain rule but not the bound; 0.05 passes both at n = 400.
    sets = [uniform(v, n) for v in (0.15, 0.15, 0.05)]
    reason, step, confirms = drive(rule, sets, sets)
    assert (reason, step, confirms) == ("alpha", 2, 3)
    assert [e["passed"] for e in rule.trace if e["stage"] == "confirm"] == [False, False, True]
    assert rule.trace[-1]["upper_bound"] == pytest.approx(hoeffding_bound(0.05, n, delta, 3))
    # The mean the trainer aims for before the next confirmation is alpha less that confirmation's slack.
    assert rule.mean_target(n) == pytest.approx(0.2 - (hoeffding_bound(0, n, delta, 4)))


def test_the_forget_weight_doubles_only_after_patience_checks_without_progress():
    from lethe.engine.methods.masc.schedule import Escalation

    escalation, weight = Escalation(patience=3), 0.01
    weights = []
    # progress, progress, then stuck (under 1 % better) for 3 checks: doubled once; stuck 3 more: again.
    for shortfall in (5.0, 4.0, 3.99, 3.98, 3.97, 3.97, 3.97, 3.97, 1.0):
        weight = escalation.update(0, shortfall, weight)
        weights.append(weight)
    assert weights == [0.01, 0.01, 0.01, 0.01, 0.02, 0.02, 0.02, 0.04, 0.04]
    assert [e["lambda_forget"] for e in escalation.trace] == [0.02, 0.04]
    capped = Escalation(patience=1)
    assert capped.update(0, 1.0, 0.8) == 0.8 and capped.update(0, 1.0, 0.8) == 1.0 and capped.update(0, 1.0, 1.0) == 1.0
    assert Escalation(patience=0).update(0, 1.0, 0.5) == 0.5 and Escalation(patience=0).trace == []


def test_steady_but_too_slow_progress_doubles_the_forget_weight_and_the_ceiling_follows_the_retain_weight():
    from lethe.engine.methods.masc.schedule import Escalation

    # 2 % better per check (progress by the 1 % test), 100 steps apart: at that pace 96 -> 0 takes about 4850
    # more steps, and 800 are left.
    slow = Escalation(patience=3, horizon=1000)
    weights = [slow.update(100 * i, 100 * 0.98 ** i, 0.01) for i in range(3)]
    assert weights == [0.01, 0.01, 0.02] and slow.trace[0]["why"] == "too slow for pace_steps"
    # Fast enough: halving every check reaches ~0 well before the horizon.
    fast = Escalation(patience=3, horizon=1000)
    assert [fast.update(10 * i, 100 * 0.5 ** i, 0.01) for i in range(6)] == [0.01] * 6
    # Without a horizon (whole records) only the 1 % test applies.
    unbounded = Escalation(patience=3)
    assert [unbounded.update(100 * i, 100 * 0.98 ** i, 0.01) for i in range(3)] == [0.01] * 3
    capped = Escalation(patience=1, ceiling=3.0)
    assert capped.update(0, 1.0, 2.0) == 2.0 and capped.update(1, 1.0, 2.0) == 3.0


def test_the_pace_aims_at_pace_steps_and_max_steps_leaves_room_past_it():
    from lethe.engine.methods.masc.params import MascParams
    from lethe.engine.methods.masc.schedule import Escalation, pace_horizon

    defaults = MascParams()
    assert (defaults.pace_steps, defaults.max_steps, defaults.lambda_forget_max) == (1000, 2000, 0.1)
    assert pace_horizon(True, defaults.pace_steps, defaults.max_steps) == 1000
    assert pace_horizon(True, 1000, 300) == 300  # a shorter cap comes first
    assert pace_horizon(False, 1000, 2000) is None  # whole records: the 1 % test only
    # The same steady pace (2 % per check, 100 steps apart) is too slow for a horizon of 1,000, not of 10,000.
    near, far = Escalation(patience=3, horizon=1000), Escalation(patience=3, horizon=10_000)
    assert [near.update(100 * i, 100 * 0.98 ** i, 0.01) for i in range(3)][-1] == 0.02
    assert [far.update(100 * i, 100 * 0.98 ** i, 0.01) for i in range(3)][-1] == 0.01


def test_records_with_located_secrets_are_judged_by_their_secrets_not_by_the_mean():
    # r0 and r1 keep their template (v 0.8, above alpha) with their secrets suppressed; r2 is suppressed whole.
    condition = ErasureCondition({"r0": 0.2, "r1": 0.2, "r2": 0.3}, secret_max=0.01, secret_ids=frozenset({"r0", "r1"}))
    rule = OnlineStopRule(alpha=0.3, check_every=1, condition=condition)
    done = [RecordCheck("r0", 0.8, 10, False, secret_probability=0.001),
            RecordCheck("r1", 0.8, 10, False, secret_probability=0.001), RecordCheck("r2", 0.25, 10, False)]
    assert rule.judged_mean(done) == pytest.approx(0.25) and mean_violation(done) == pytest.approx(0.6167, abs=1e-4)
    assert rule.passes(done)[0]  # the full mean 0.62 > alpha does not hold the stop back
    # r2 above alpha fails the mean (its ceiling 0.3 holds): no stop; a secret above its limit: no stop either.
    assert not rule.passes(done[:2] + [RecordCheck("r2", 0.31, 10, False)])[0]
    assert not rule.passes([RecordCheck("r0", 0.8, 10, False, secret_probability=0.02)] + done[1:])[0]
    # Every record located: the mean is vacuous, the secrets decide; the confirmation says which mean it judged.
    only = OnlineStopRule(alpha=0.3, check_every=1, condition=ErasureCondition({}, 0.01, frozenset({"r0", "r1"})))
    assert only.judged_mean(done[:2]) is None
    assert only.check(0, lambda: done[:2], lambda: done[:2])
    assert only.trace[-1]["v_judged"] is None and only.trace[-1]["v"] == pytest.approx(0.8)
    # Without secrets the mean is over every record, as in the paper.
    assert OnlineStopRule(alpha=0.3, check_every=1).judged_mean(done) == pytest.approx(mean_violation(done))


def test_loops_alone_are_allowed_in_as_many_records_as_a_never_seen_model_loops_on_by_chance():
    """Brute force over every pattern of 7 records (clean, looping, leaking, both, over the ceiling and looping): the
    records failing are those failing some part other than a loop, and of those failing by a loop alone all but
    floor(n q) of them; never a leak, whatever the chance."""
    import itertools
    from dataclasses import replace

    kinds = {"clean": {}, "loop": {"looped": True}, "leak": {"leaked": True},
             "both": {"leaked": True, "looped": True}, "over": {"looped": True, "violation": 0.5}}
    for q in (0.0, 0.15, 0.3, 1.0):
        condition = ErasureCondition({f"r{i}": 0.1 for i in range(7)}, loop_chance=q)
        allowance = math.floor(7 * q + 1e-9)
        assert condition.loop_allowance(7) == allowance
        for pattern in itertools.product(kinds, repeat=7):
            checks = [replace(c, **kinds[k]) for c, k in zip(records(*[0.0] * 7), pattern)]
            loops_alone = [f"r{i}" for i, k in enumerate(pattern) if k == "loop"]
            expected = [f"r{i}" for i, k in enumerate(pattern) if k in ("leak", "both", "over")
                        or (k == "loop" and loops_alone.index(f"r{i}") >= allowance)]
            assert condition.failing(checks) == expected, (q, pattern)
            why = condition.failing_why(checks)
            assert why.get("looped_within_chance", 0) == min(allowance, len(loops_alone))
            assert why.get("leaked", 0) == sum(k in ("leak", "both") for k in pattern)


def test_a_coalesced_runs_requests_each_have_their_own_loop_allowance():
    """10 records of request a and 5 of b at q = 0.2: a may loop in 2, b in 1; four loops all in b fail three of
    them though the run's 15 records would allow 3."""
    from dataclasses import replace

    checks = records(*[0.0] * 15)
    requests = {f"r{i}": "a" if i < 10 else "b" for i in range(15)}
    condition = ErasureCondition({}, loop_chance=0.2, requests=requests)
    looping = [replace(c, looped=True) if i >= 11 else c for i, c in enumerate(checks)]
    assert condition.loop_allowances([c.id for c in checks]) == {"a": 2, "b": 1}
    assert condition.loops_within_chance(looping) == ["r11"]
    assert condition.failing(looping) == ["r12", "r13", "r14"]
    spread = [replace(c, looped=True) if i in (0, 1, 10) else c for i, c in enumerate(checks)]
    assert condition.failing(spread) == []


def test_the_rule_fires_with_loops_within_chance_and_not_past_it():
    from dataclasses import replace

    condition = ErasureCondition({f"r{i}": 0.5 for i in range(20)}, loop_chance=0.1)
    rule = OnlineStopRule(alpha=0.5, check_every=1, condition=condition)
    two = [replace(c, looped=i < 2) for i, c in enumerate(uniform(0.0, 20))]
    three = [replace(c, looped=i < 3) for i, c in enumerate(uniform(0.0, 20))]
    assert not rule.passes(three)[0] and rule.passes(two)[0]
    assert drive(rule, [two, two], [three, two]) == ("alpha", 1, 2)
    assert rule.trace[1]["failing_records"] == 1 and rule.trace[1]["failing_why"] == {"looped_within_chance": 2,
                                                                                       "looped": 1}
