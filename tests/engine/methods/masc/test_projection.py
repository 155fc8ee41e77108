"""project_forget: the step's gradient is the retain gradient plus the forget gradient without its component
against it (PCGrad), checked against gradients computed one term at a time."""
import pytest
import torch

from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import collate, encode_records
from lethe.engine.methods.masc import margin as M
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.loading import TrainableModel, load_model

pytestmark = pytest.mark.slow  # trains the session's fixture model


def _batch(tokenizer, records, what):
    return collate(encode_records(normalise_records(records, what), tokenizer, max_length=512, seed=0, what=what),
                   tokenizer.pad_token_id)


def _gradient(policy, loss):
    parameters = [p for p in policy.model.parameters() if p.requires_grad]
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, parameters)])


def _relative_error(a, b):
    """|a - b| / |b| over the whole gradient: the joint batch's padding moves single entries by float noise."""
    return float((a - b).norm() / b.norm())


def _step_gradient(masc, forget, retain):
    masc.trainable.model.zero_grad(set_to_none=True)
    loss, parts = masc.loss(forget, retain)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in masc.trainable.model.parameters() if p.requires_grad]), parts


@pytest.mark.parametrize("lora", [True, False])
def test_the_forget_gradient_loses_its_component_against_the_retain_gradient(fixture_model, forget_records, lora):
    torch.manual_seed(0)
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    policy = TrainableModel(model, lora=lora)
    forget = _batch(tokenizer, forget_records[:3], "forget")
    # The same texts as retain rows, after a few steps that lowered them: the retain term pulls them back up,
    # against the forget hinge, so the two gradients conflict.
    retain = _batch(tokenizer, forget_records[:3], "retain")
    optimiser = torch.optim.SGD(policy.trainable_parameters(), lr=1e-2 if lora else 1e-3)
    for _ in range(3):
        z, y, _ = M.active_positions(policy.logits(forget), forget.labels)
        optimiser.zero_grad()
        (-M.token_nll(z, y)).backward()
        optimiser.step()
    params = MascParams.from_dict({"suppress": "whole", "project_forget": True}).resolved()
    masc = Masc(params, policy, tokenizer.pad_token_id)

    # Brute force: each side's gradient from its own forward pass.
    logits = policy.logits(forget)
    margins, _, _, _, focus = masc._margins(logits, forget)
    g_f = _gradient(policy, masc.forget_weight * M.buffered_hinge(margins, masc._thresholds(focus), params.eta).mean())
    z, y, _ = M.active_positions(policy.logits(retain), retain.labels)
    g_r = _gradient(policy, params.retain_weight * masc._retain_term(policy.logits(retain), retain.labels, retain))
    dot = float(g_f @ g_r)
    assert dot < 0  # the case the projection is for
    expected = g_f - dot / float(g_r @ g_r) * g_r + g_r

    projected, parts = _step_gradient(masc, forget, retain)
    assert parts["conflict"] == 1.0
    assert _relative_error(projected, expected) < 1e-4
    assert float((projected - g_r) @ g_r) == pytest.approx(0, abs=1e-4 * float(g_r @ g_r))  # no forget part against

    masc.params = MascParams.from_dict({"suppress": "whole", "project_forget": False}).resolved()
    plain, parts = _step_gradient(masc, forget, retain)
    assert "conflict" not in parts
    assert _relative_error(plain, g_f + g_r) < 1e-4
    assert _relative_error(plain, projected) > 1e-2  # the projection changed the step
