"""What a replay refresh reads (issue 28): a run of many records also asks the records its answers alone hold open, up
to a fifth of the forget set, and measures at most REFRESHED records again, closed ones first. A policy built
by hand around scripted record states: no model runs."""
import random
import types
from dataclasses import replace

from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.refresh import REFRESHED
from lethe.engine.methods.masc.stop_policy import MascStopPolicy
from lethe.engine.methods.masc.stop_rule import ErasureCondition, OnlineStopRule, RecordCheck, RecordStates

MET = RecordCheck("", 0.0, 10, False)


def policy(states: dict[str, RecordCheck], replay_records: int = 8) -> MascStopPolicy:
    """Every record's content located: a record is open exactly when it fails its own condition."""
    rule = MascStopPolicy.__new__(MascStopPolicy)
    records = [types.SimpleNamespace(id=rid) for rid in states]
    rule.params = MascParams(replay_records=replay_records).resolved()
    rule.train_mode, rule.train_set, rule.judged_mean = True, records, None
    rule.run = types.SimpleNamespace(forget=records)
    rule.erasure = ErasureCondition({rid: 1.0 for rid in states}, 0.01, frozenset(states))
    rule.rule = OnlineStopRule(0.5, 1, condition=rule.erasure)
    rule.located, rule.confirm_set = frozenset(states), records
    rule.latest = RecordStates([replace(c, id=rid) for rid, c in states.items()])
    rule.refreshed_at, rule.answered_at = {}, {}
    rule.measured = []

    def measure(records, model=None):
        rule.measured.append([r.id for r in records])
        return [replace(MET, id=r.id) for r in records]
    rule.measure = measure
    return rule


def states(by_answers: int, by_teacher_forcing: int, closed: int) -> dict[str, RecordCheck]:
    out = {f"a{i}": replace(MET, leaked=True) for i in range(by_answers)}
    out |= {f"t{i}": replace(MET, secret_greedy=True, leaked=True) for i in range(by_teacher_forcing)}
    return out | {f"c{i}": MET for i in range(closed)}


def test_a_refresh_asks_more_of_the_records_held_open_by_their_answers_up_to_a_fifth_of_the_forget_set():
    rule = policy(states(30, 50, 20))
    asked = [r.id for r in rule.to_ask(random.Random(0))]
    # 100 records: a sample of 8 open ones, then 12 more of those held by their answers alone (a fifth: 20).
    assert len(asked) == 20 and len(set(asked)) == 20 and all(rid.startswith("a") for rid in asked[8:])
    assert not any(rid.startswith("c") for rid in asked)  # the fifth is spent on open ones: no closed record
    # A request of 40 asks as before issue 28: the same seeded sample of replay_records of its open records.
    small = policy(states(12, 20, 8))
    expected = random.Random(0).sample([r for r in small.train_set if small.is_open(r.id)], 8)
    assert small.to_ask(random.Random(0)) == expected


def test_a_refresh_measures_at_most_REFRESHED_records_closed_ones_first_the_longest_unmeasured_first():
    rule = policy(states(0, 50, 100))
    first = rule.remeasure(20)
    assert len(first) == REFRESHED and all(r.id.startswith("c") for r in first)
    second = {r.id for r in rule.remeasure(40)}
    unmeasured = {f"c{i}" for i in range(100)} - {r.id for r in first}
    assert unmeasured <= second and len(second) == REFRESHED  # the other 36 first, then the oldest closed ones
    assert not any(rid.startswith("t") for rid in second)
    assert rule.measured[0] == [r.id for r in first]
    # A closed record measured again and found failing is open again: the next refresh asks its answers.
    rule.measure = lambda records, model=None: [replace(MET, id=r.id, secret_greedy=True) for r in records]
    reopened = rule.remeasure(60)
    assert reopened and all(rule.is_open(r.id) for r in reopened)
    # A forget set of at most REFRESHED records is measured whole at every refresh, in its own order.
    small = policy(states(5, 20, 10))
    assert [r.id for r in small.remeasure(20)] == list(states(5, 20, 10))


def test_what_is_left_of_the_fifth_asks_the_closed_records_answered_longest_ago():
    rule = policy(states(1, 2, 47))  # 50 records: a fifth is 10 answers a refresh
    rule.params = MascParams(replay_records=2).resolved()
    rule.answered_at = {f"c{i}": 100 - i for i in range(47)}  # the later in the list, the longer ago
    rule.answered_at["c7"] = -5  # not asked since the start: first of the closed
    asked = [r.id for r in rule.to_ask(random.Random(0))]
    # 2 open ones sampled, a0 (open on its answers alone) if not among them, then closed ones, longest ago first
    opened = [rid for rid in asked if not rid.startswith("c")]
    assert "a0" in opened and asked[:len(opened)] == opened and len(opened) in (2, 3) and len(asked) == 10
    assert asked[len(opened):] == ["c7", "c46", "c45", "c44", "c43", "c42", "c41", "c40"][:10 - len(opened)]
    # 20 records, 3 open: all 3 (fewer than replay_records), then one closed one to make a fifth
    small = policy(states(1, 2, 17))
    asked = [r.id for r in small.to_ask(random.Random(0))]
    assert set(asked[:3]) == {"a0", "t0", "t1"} and asked[3:] == ["c0"]  # none answered yet: the run's order
