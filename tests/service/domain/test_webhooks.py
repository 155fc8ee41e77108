"""Issue 26: the webhook dispatcher's choice of what to send next (lethe.service.domain.webhooks.fair_pick), checked
against its rules on every small case: one POST per endpoint, a tenant at most per_tenant in flight, tenants in
turns, and no slot left empty while something may go."""
import itertools
import random

from lethe.service.domain.webhooks import fair_pick


def test_fair_pick_keeps_its_rules_on_random_cases():
    rng = random.Random(0)
    for _ in range(3000):
        tenants = ["a", "b", "c"][: rng.randint(1, 3)]
        endpoints = [(t, f"{t}{i}") for t in tenants for i in range(rng.randint(0, 4))]
        heads = [(f"d{n}", t, e) for n, (t, e) in enumerate(rng.sample(endpoints, len(endpoints)))]
        busy = rng.sample(endpoints, rng.randint(0, min(3, len(endpoints))))
        slots, per_tenant = rng.randint(0, 4), rng.randint(1, 3)
        picked = fair_pick(heads, busy, slots, per_tenant)
        assert len(picked) <= slots and all(p in heads for p in picked)
        assert len({e for _, _, e in picked}) == len(picked) and not {e for _, _, e in picked} & {e for _, e in busy}
        load = {t: sum(1 for b, _ in busy if b == t) + sum(1 for _, p, _ in picked if p == t) for t in tenants}
        assert all(load[t] <= max(per_tenant, sum(1 for b, _ in busy if b == t)) for t in tenants)
        # Nothing that may go is left behind while a slot is free.
        eligible = {t: min(len([h for h in heads if h[1] == t and h[2] not in {e for _, e in busy}]),
                           max(0, per_tenant - sum(1 for b, _ in busy if b == t))) for t in tenants}
        assert len(picked) == min(slots, sum(eligible.values()))
        # Turns: no tenant has two more picks than another that still had something eligible.
        counts = {t: sum(1 for _, p, _ in picked if p == t) for t in tenants}
        for s, t in itertools.permutations(tenants, 2):
            if counts[t] < eligible[t]:
                assert counts[s] <= counts[t] + 1, (heads, busy, slots, per_tenant, picked)


def test_the_tenant_with_the_oldest_delivery_goes_first():
    heads = [("d1", "b", "b1"), ("d2", "a", "a1"), ("d3", "b", "b2"), ("d4", "a", "a2")]
    assert [d for d, _, _ in fair_pick(heads, [], 3, 2)] == ["d1", "d2", "d3"]
    assert [d for d, _, _ in fair_pick(heads, [("b", "bx"), ("b", "by")], 3, 2)] == ["d2", "d4"]
