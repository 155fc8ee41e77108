"""`make bench-sequential`'s judgement of earlier sets: a secret that another record says does not count as the
erased set coming back, and a set regresses only when its own figure rises."""
from bench.bench_sequential import distinctive_secrets, regressed
from lethe.engine.data.secrets import leaked_secrets


def test_a_secret_another_record_says_is_not_distinctive_and_one_no_other_says_is():
    secrets = {"a": ["Taipei", "civil engineering", "honored"], "b": ["1977"], "c": []}
    others = [{"completion": "Wei-Jun Chen was born in Taipei."}, {"completion": "She was Honored with a prize."},
              {"prompt": "Question: born in 1977?", "completion": "No."}]  # a prompt says nothing: only answers count
    got = distinctive_secrets(secrets, others)
    assert got == {"a": ["civil engineering"], "b": ["1977"], "c": []}
    # Brute force: kept exactly when no other answer leaks it.
    for rid, spans in secrets.items():
        assert got[rid] == [s for s in spans if all(leaked_secrets([s], o["completion"]) == 0 for o in others)]


def test_a_set_regresses_when_its_exact_match_or_the_named_leak_rises_above_its_own_erasure():
    own = [{"exact_match": 0.0, "leak_distinctive": 0.1, "leak_greedy": 0.2},
           {"exact_match": 0.0, "leak_distinctive": 0.0, "leak_greedy": 0.1}]
    now = [{"exact_match": 0.0, "leak_distinctive": 0.1, "leak_greedy": 0.3},   # raw rose, distinctive did not
           {"exact_match": 0.05, "leak_distinctive": 0.0, "leak_greedy": 0.1}]  # exact match rose
    assert regressed(now, own, "leak_distinctive") == [2]
    assert regressed(now, own, "leak_greedy") == [1, 2]
    assert regressed(own, own, "leak_greedy") == []
