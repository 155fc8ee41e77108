"""The online stop rule driven by scripted V values."""
import math

import pytest

from worker.engine.stop_rule import OnlineStopRule, hoeffding_bound


def drive(rule, triggers, confirms, n=50, max_steps=100):
    """Step like the trainer: check when due, stop on the rule or at max_steps."""
    triggers, confirms = iter(triggers), iter(confirms)
    calls = {"confirm": 0}

    def confirm():
        calls["confirm"] += 1
        return next(confirms), n

    step = 0
    while True:
        if rule.due(step) and rule.check(step, lambda: (next(triggers), 8), confirm):
            return "alpha", step, calls["confirm"]
        if step >= max_steps:
            return "max_steps", step, calls["confirm"]
        step += 1


def test_stops_at_first_confirmed_check_at_or_below_alpha():
    rule = OnlineStopRule(alpha=0.2, check_every=5)
    # trigger: high, high, passes (confirm fails), passes (confirm passes at exactly alpha)
    reason, step, confirms = drive(rule, [0.9, 0.5, 0.1, 0.2, 0.0], [0.3, 0.2])
    assert (reason, step, confirms) == ("alpha", 15, 2)
    assert [e["stage"] for e in rule.trace] == ["trigger", "trigger", "trigger", "confirm", "trigger", "confirm"]
    assert rule.trace[3]["passed"] is False and rule.trace[-1]["passed"] is True
    assert rule.latest_v == 0.2


def test_no_confirmation_while_the_trigger_is_above_alpha():
    rule = OnlineStopRule(alpha=0.2, check_every=1)
    reason, step, confirms = drive(rule, [0.21] * 11, [], max_steps=10)
    assert (reason, step, confirms) == ("max_steps", 10, 0)
    assert len(rule.trace) == 11  # checks at steps 0..10


def test_max_steps_is_a_safety_cap():
    rule = OnlineStopRule(alpha=0.2, check_every=4)
    reason, step, confirms = drive(rule, [0.1] * 10, [0.5] * 10, max_steps=12)
    assert (reason, step, confirms) == ("max_steps", 12, 4)  # checks at 0, 4, 8, 12 all refuted


def test_hoeffding_variant_requires_the_upper_bound_below_alpha():
    delta, n = 0.05, 400
    # j-th confirmation: bound = V + sqrt(log(pi^2 j^2 / (6 delta)) / 2n)
    expected = 0.1 + math.sqrt(math.log(math.pi ** 2 * 1 / (6 * delta)) / (2 * n))
    assert math.isclose(hoeffding_bound(0.1, n, delta, 1), expected)
    assert hoeffding_bound(0.1, n, delta, 2) > hoeffding_bound(0.1, n, delta, 1)  # delta_j shrinks
    rule = OnlineStopRule(alpha=0.2, check_every=1, hoeffding=True, delta=delta)
    # 0.15 passes the plain rule but not the bound; 0.05 passes both at n = 400.
    reason, step, confirms = drive(rule, [0.15, 0.15, 0.05], [0.15, 0.15, 0.05], n=n)
    assert (reason, step, confirms) == ("alpha", 2, 3)
    assert [e["passed"] for e in rule.trace if e["stage"] == "confirm"] == [False, False, True]
    assert rule.trace[-1]["upper_bound"] == pytest.approx(hoeffding_bound(0.05, n, delta, 3))
