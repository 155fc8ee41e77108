"""The baselines' objectives against hand computation on tiny batches (issue 5, first step)."""
import math

import pytest
import torch
import torch.nn.functional as F

import lethe.engine.methods.objectives as O
from lethe.engine.data.records import IGNORE

# Two sequences over a vocabulary of 4; position t's logits predict labels[t + 1].
LABELS = torch.tensor([[IGNORE, 1, 2, IGNORE], [IGNORE, IGNORE, 3, 0]])


def logits(seed=0):
    return torch.randn(2, 4, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def brute_logprobs(z):
    """Per sequence: sum of log p(label) over active positions, by a loop."""
    out = []
    for b in range(2):
        total = 0.0
        for t in range(3):
            if LABELS[b, t + 1] != IGNORE:
                total += F.log_softmax(z[b, t], -1)[LABELS[b, t + 1]].item()
        out.append(total)
    return out


def test_sequence_logprobs_and_ga_by_loop():
    z = logits()
    sums, counts = O.sequence_logprobs(z, LABELS)
    assert sums.tolist() == pytest.approx(brute_logprobs(z)) and counts.tolist() == [2, 2]
    # GA: -NLL_f, the token mean over all four active tokens
    assert O.gradient_ascent(z, LABELS).item() == pytest.approx(sum(brute_logprobs(z)) / 4)


def test_graddiff_weights():
    zf, zr = logits(0), logits(1)
    nll_f, nll_r = -sum(brute_logprobs(zf)) / 4, -sum(brute_logprobs(zr)) / 4
    assert O.grad_diff(zf, LABELS, zr, LABELS, gamma=2.0, alpha=0.5).item() == pytest.approx(-2 * nll_f + 0.5 * nll_r)


def test_npo_sign_and_normalisation():
    z = logits(2)
    beta = 0.1
    # At the reference: (2/beta) log 2.
    assert O.npo(z, z.clone(), LABELS, beta).item() == pytest.approx(2 / beta * math.log(2))
    ref = logits(3)
    theta_lp, ref_lp = brute_logprobs(z), brute_logprobs(ref)
    expected = sum(-(2 / beta) * math.log(1 / (1 + math.exp(beta * (t - r)))) for t, r in zip(theta_lp, ref_lp)) / 2
    assert O.npo(z, ref, LABELS, beta).item() == pytest.approx(expected)
    # Lowering the forget likelihood lowers the loss: the gradient pushes log pi_theta(y|x) down.
    z.requires_grad_(True)
    O.npo(z, ref, LABELS, beta).backward()
    assert z.grad[0, 0, 1] > 0  # d loss / d logit of a forget token is positive


def test_simnpo_sign_and_normalisation():
    z = logits(4)
    beta, delta = 4.5, 0.0
    lp = brute_logprobs(z)
    expected = sum(-(2 / beta) * math.log(1 / (1 + math.exp(-beta * (-s / 2 - delta)))) for s in lp) / 2
    assert O.simnpo(z, LABELS, beta, delta).item() == pytest.approx(expected)
    # With delta equal to the mean NLL of both sequences' tokens the loss is (2/beta) log 2 each.
    same = torch.zeros(2, 4, 4, dtype=torch.float64)  # uniform: NLL log 4 per token
    assert O.simnpo(same, LABELS, beta, math.log(4)).item() == pytest.approx(2 / beta * math.log(2))


def test_rmu_terms_by_hand():
    fh = torch.tensor([[[1.0, 1.0], [3.0, 3.0]]])  # one sequence, two tokens, width 2
    mask = torch.tensor([[1.0, 0.0]])  # the second token is padding
    control = torch.tensor([2.0, 0.0])
    rh, ref = torch.tensor([[[1.0, 2.0], [0.0, 0.0]]]), torch.tensor([[[1.0, 0.0], [5.0, 5.0]]])
    total, forget_term, retain_term = O.rmu(fh, mask, control, rh, ref, mask, alpha=100.0)
    assert forget_term.item() == pytest.approx(((1 - 2) ** 2 + (1 - 0) ** 2) / 2)  # padding ignored
    assert retain_term.item() == pytest.approx((0 + 4) / 2)
    assert total.item() == pytest.approx(1.0 + 100 * 2.0)


def test_destination_margin_raises_each_token_by_its_target_probability():
    """Where a position has a target q, the hinge's margin is z(y) - sum_v q(v) z(v) over q without the gold: its
    gradient is +beta on the gold and -beta q(v) on each destination token, by brute force on a tiny batch; a
    position without a target keeps the model's own margin."""
    from lethe.engine.data.records import Batch
    from lethe.engine.methods.masc import margin as M
    from lethe.engine.methods.masc.objective import Masc
    from lethe.engine.methods.masc.params import MascParams

    torch.manual_seed(0)
    vocab, beta = 7, 2.0
    masc = Masc(MascParams(beta=beta).resolved(), trainable=None, pad_id=0)  # type: ignore[arg-type]
    labels = torch.tensor([[IGNORE, 3, 5]])
    ids = torch.zeros(1, 3, 4, dtype=torch.long)
    probs = torch.zeros(1, 3, 4)
    ids[0, 1] = torch.tensor([1, 3, 4, 6])  # the gold (3) is among the ids: it never counts
    probs[0, 1] = torch.tensor([0.5, 0.2, 0.2, 0.1])
    batch = Batch(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3), labels, None, ids, probs)
    logits = torch.randn(1, 3, vocab, requires_grad=True)
    z, y, _ = M.active_positions(logits, labels)
    own = torch.tensor([0.123, 0.456])
    margins = masc._destination_margins(own, z, y, masc._active_targets(batch))
    q = {1: 0.5 / 0.8, 4: 0.2 / 0.8, 6: 0.1 / 0.8}
    expected = beta * (float(z[0, 3]) - sum(p * float(z[0, v]) for v, p in q.items()))
    assert float(margins[0]) == pytest.approx(expected, rel=1e-5)
    assert float(margins[1]) == pytest.approx(0.456)  # no target there: the model's own margin stays
    margins[0].backward()
    grad = logits.grad[0, 0]
    assert float(grad[3]) == pytest.approx(beta)
    for v in range(vocab):
        if v != 3:
            assert float(grad[v]) == pytest.approx(-beta * q.get(v, 0.0), abs=1e-6)
