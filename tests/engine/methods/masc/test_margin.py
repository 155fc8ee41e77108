"""MASC's margin (computed in float32 by design), tau, hinge and violation against brute-force loops over positions
and tokens."""
import math

import pytest
import torch

from lethe.engine.data.records import IGNORE
from lethe.engine.methods.masc import margin as M


def brute_margin(z_row, gold, k, beta, allowed=None):
    """Sort every non-gold token by logit, take k (only `allowed` ones in teacher mode), logsumexp."""
    others = [(z_row[v], v) for v in range(len(z_row)) if v != gold]
    others.sort(key=lambda pair: -pair[0])
    chosen = [value for value, v in others[:k] if allowed is None or v in allowed]
    return beta * z_row[gold] - math.log(sum(math.exp(beta * value) for value in chosen))


def brute_teacher_allowed(z0_row, gold, k, delta):
    others = sorted(((z0_row[v], v) for v in range(len(z0_row)) if v != gold), key=lambda p: -p[0])[:k]
    best = others[0][0]
    return {v for value, v in others if value >= best - delta}


def random_case(seed, batch=3, length=7, vocab=11, ties=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)
    if ties:  # quantise so that many logits tie
        logits = (logits * 2).round() / 2
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    labels[:, :2] = IGNORE  # a prompt
    labels[0, -2:] = IGNORE  # padding
    labels[-1, 4] = IGNORE  # a masked position inside
    return logits, labels


def brute_positions(logits, labels):
    """(row, position, gold) for every active position, in row-major order."""
    out = []
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1] - 1):
            if labels[b, t + 1] != IGNORE:
                out.append((b, t, int(labels[b, t + 1])))
    return out


@pytest.mark.parametrize("seed,k,beta,ties", [(0, 3, 1.0, False), (1, 1, 1.0, False), (2, 10, 1.0, False),
                                              (3, 50, 1.0, False), (4, 4, 2.5, False), (5, 3, 1.0, True),
                                              (6, 2, 0.5, True)])
def test_self_margin_matches_brute_force(seed, k, beta, ties):
    logits, labels = random_case(seed, ties=ties)
    z, y, rows = M.active_positions(logits, labels)
    margin = M.restricted_margin(z, y, M.self_alternatives(z, y, k), beta=beta)
    expected = [brute_margin(logits[b, t].tolist(), gold, min(k, logits.shape[-1] - 1), beta)
                for b, t, gold in brute_positions(logits, labels)]
    assert margin.shape[0] == len(expected)
    assert torch.allclose(margin, torch.tensor(expected, dtype=margin.dtype), atol=1e-5)
    assert rows.tolist() == [b for b, _, _ in brute_positions(logits, labels)]


def test_k_at_least_vocab_minus_one_uses_every_other_token():
    logits, labels = random_case(7, vocab=5)
    z, y, _ = M.active_positions(logits, labels)
    for k in (4, 5, 100):
        margin = M.restricted_margin(z, y, M.self_alternatives(z, y, k))
        # Every non-gold token: m = z_y - logsumexp_{v != y} z_v
        without_gold = z.scatter(1, y[:, None], float("-inf"))
        expected = z.gather(1, y[:, None]).squeeze(1) - torch.logsumexp(without_gold, -1)
        assert torch.allclose(margin.double(), expected, atol=1e-5)


@pytest.mark.parametrize("seed,k,delta,beta", [(0, 5, 0.5, 1.0), (1, 3, 0.0, 1.0), (2, 10, 2.0, 5.0),
                                               (3, 2, 0.5, 5.0)])
def test_teacher_margin_matches_brute_force(seed, k, delta, beta):
    logits, labels = random_case(seed)
    ref = logits + torch.randn(logits.shape, generator=torch.Generator().manual_seed(99), dtype=logits.dtype)
    z, y, _ = M.active_positions(logits, labels)
    z0, _, _ = M.active_positions(ref, labels)
    indices, keep = M.teacher_alternatives(z0, y, k, delta)
    margin = M.restricted_margin(z, y, indices, keep, beta)
    expected = []
    for b, t, gold in brute_positions(logits, labels):
        allowed = brute_teacher_allowed(ref[b, t].tolist(), gold, k, delta)
        # Scored with the current model's logits, over theta_0's chosen tokens only.
        expected.append(beta * logits[b, t, gold].item()
                        - math.log(sum(math.exp(beta * logits[b, t, v].item()) for v in allowed)))
    assert torch.allclose(margin, torch.tensor(expected, dtype=margin.dtype), atol=1e-5)
    assert keep[:, 0].all()  # the best non-gold token is always kept


def test_tau_hinge_and_violation_against_definitions():
    for rho in (0.1, 0.5, 0.7, 0.95):
        t = M.tau(rho)
        assert math.isclose(1 / (1 + math.exp(-t)), rho)  # sigmoid(tau) = rho
    margin = torch.tensor([-3.0, -0.2, 0.0, 0.1, 0.5, 2.0])
    tau_value, eta = 0.0, 0.5
    hinge = M.buffered_hinge(margin, tau_value, eta)
    expected = [max(0.0, m - (tau_value - eta)) / eta for m in margin.tolist()]
    assert torch.allclose(hinge, torch.tensor(expected))
    # An upper bound of the violation indicator, zero well inside the suppressed region.
    assert (hinge >= (margin > tau_value).float()).all()
    assert hinge[0] == 0
    rows = torch.tensor([0, 0, 0, 1, 1, 2])
    v = M.sequence_violation(margin, rows, 3, tau_value)
    assert v.tolist() == [0.0, 1.0, 1.0]


def test_violation_rate_is_macro_average_over_sequences():
    logits, labels = random_case(11)
    z, y, rows = M.active_positions(logits, labels)
    margin = M.restricted_margin(z, y, M.self_alternatives(z, y, 3))
    t = M.tau(0.3)
    v = M.sequence_violation(margin, rows, logits.shape[0], t)
    positions = brute_positions(logits, labels)
    for b in range(logits.shape[0]):
        own = [m > t for m, (row, _, _) in zip(margin.tolist(), positions) if row == b]
        assert math.isclose(v[b].item(), sum(own) / len(own), rel_tol=1e-6)


def test_gradient_reaches_gold_and_chosen_alternatives_only():
    logits, labels = random_case(12, batch=1, length=6, vocab=9)
    logits.requires_grad_(True)
    z, y, _ = M.active_positions(logits, labels)
    indices = M.self_alternatives(z, y, 2)
    M.restricted_margin(z, y, indices).sum().backward()
    grad = logits.grad[0, :-1]
    for row, (t, gold) in enumerate([(t, g) for _, t, g in brute_positions(logits, labels)]):
        touched = set(torch.nonzero(grad[t]).flatten().tolist())
        assert touched == {gold, *indices[row].tolist()}


def test_kept_argmax_hinge_against_a_loop_over_tokens():
    torch.manual_seed(3)
    z, z0 = torch.randn(9, 13) * 3, torch.randn(9, 13) * 3
    y = torch.randint(0, 13, (9,))
    y[0] = int(z0[0].argmax())  # at least one token theta_0 had as its argmax
    gap = 1.5
    expected = []
    for i in range(9):
        g = z[i, y[i]].item() - max(z[i, v].item() for v in range(13) if v != y[i])
        g0 = z0[i, y[i]].item() - max(z0[i, v].item() for v in range(13) if v != y[i])
        expected.append(max(0.0, min(gap, g0) - g))
    assert M.kept_argmax_hinge(z, z0, y, gap).item() == pytest.approx(sum(expected) / 9, rel=1e-5)
    # Unchanged weights keep every gap: nothing to pay; the gradient pulls only tokens that fell behind.
    assert M.kept_argmax_hinge(z0, z0, y, gap).item() == 0.0
    z.requires_grad_(True)
    M.kept_argmax_hinge(z, z0, y, gap).backward()
    moved = {i for i in range(9) if z.grad[i].abs().sum() > 0}
    assert moved == {i for i in range(9) if expected[i] > 0}


def brute_drift(z, z0):
    moved = spread = 0.0
    for i in range(len(z)):
        kept = [v for v in range(z.shape[1]) if math.isfinite(z0[i, v].item())]
        mean, mean0 = (sum(z[i, v].item() for v in kept) / len(kept), sum(z0[i, v].item() for v in kept) / len(kept))
        moved += sum(((z[i, v].item() - mean) - (z0[i, v].item() - mean0)) ** 2 for v in kept)
        spread += sum((z0[i, v].item() - mean0) ** 2 for v in kept)
    return moved / spread


@pytest.mark.parametrize("denied", [False, True])
def test_centred_logit_drift_against_a_loop_over_tokens(denied):
    torch.manual_seed(4)
    z, z0 = torch.randn(7, 11) * 3, torch.randn(7, 11) * 3
    if denied:
        z0[2, 5] = float("-inf")  # a token theta_0 denies: left out of that row, its mean and the spread
    assert M.centred_logit_drift(z, z0).item() == pytest.approx(brute_drift(z, z0), rel=1e-5)
    # theta_0 itself, or theta_0 plus a constant per row (the same distributions), pays nothing ...
    assert M.centred_logit_drift(z0, z0).item() == 0.0
    assert M.centred_logit_drift(z0 + torch.randn(7, 1) * 5, z0).item() == pytest.approx(0.0, abs=1e-10)
    # ... and the term is scale-free: both sides scaled alike give the same value.
    assert M.centred_logit_drift(10 * z, 10 * z0).item() == pytest.approx(M.centred_logit_drift(z, z0).item(), rel=1e-5)
    # The gradient moves the logits towards theta_0's (never a denied token's).
    z.requires_grad_(True)
    M.centred_logit_drift(z, z0).backward()
    assert (z.grad[2, 5] == 0) == denied
    step = z.detach() - 0.1 * z.grad
    assert M.centred_logit_drift(step, z0) < M.centred_logit_drift(z.detach(), z0)


def test_lineage_reference_against_a_loop_over_tokens():
    """Where the start gives the target a lower probability than the anchor (it drifted): the anchor's centred logit
    for the target, the lower of the anchor's and the start's for every other token. Elsewhere the start's own row."""
    torch.manual_seed(5)
    anchor, start = torch.randn(6, 9) * 3 + 4, torch.randn(6, 9) * 3 - 1
    anchor[1, 3] = float("-inf")  # denied by the anchor: stays denied
    y = torch.randint(0, 9, (6,))
    y[1] = 4
    start[0, y[0]], anchor[0, y[0]] = 30.0, 0.0  # row 0: the start holds its target (it has not drifted there)
    start[2, y[2]], anchor[2, y[2]] = -30.0, 30.0  # row 2: the start lost its target
    reference = M.lineage_reference(anchor, start, y)
    held = []
    for i in range(6):
        finite = [v for v in range(9) if math.isfinite(anchor[i, v].item())]
        mean_a = sum(anchor[i, v].item() for v in finite) / len(finite)
        mean_s = sum(start[i, v].item() for v in range(9)) / 9
        log_z_a = math.log(sum(math.exp(anchor[i, v].item()) for v in finite))
        log_z_s = math.log(sum(math.exp(start[i, v].item()) for v in range(9)))
        kept = start[i, y[i]].item() - log_z_s >= anchor[i, y[i]].item() - log_z_a
        held.append(kept)
        for v in range(9):
            a, s = anchor[i, v].item() - mean_a, start[i, v].item() - mean_s
            expected = s if kept else a if v == y[i] else min(a, s)
            assert reference[i, v].item() == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert held[0] and not held[2] and not all(held)  # both kinds of row are checked
    # A start equal to the anchor (a run from the anchor's own version) gives the anchor back, centred.
    assert torch.allclose(M.lineage_reference(start, start, y), start - start.mean(-1, keepdim=True), atol=1e-6)
