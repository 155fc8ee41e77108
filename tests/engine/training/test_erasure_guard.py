"""The erasure guard (issue 28): a run anchored to an earlier version keeps its update off the input directions the
erasures since that version wrote into each whitened projection. Checked against the math on small inputs (the
protected subspace holds the erased inputs; the projection is exact under AdamW, for Linear and GPT-2's Conv1D) and
on two chained runs of the fixture model: the second changes the projections' response on the first run's forget
inputs far less with the guard than without."""
import copy

import pytest
import torch
from transformers.pytorch_utils import Conv1D

from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.inputs import RunInputs
from lethe.engine.data.records import encode_records
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.loading import load_model, lora_modules, save_model
from lethe.engine.training.erasure_guard import damped_inverse_root, guard_erasures, protected_subspace
from lethe.engine.training.whitening import input_second_moments
from lethe.engine.unlearn import unlearn


def retained_moment(g: torch.Generator, width: int) -> torch.Tensor:
    scale = torch.linspace(2.0, 0.05, width)
    x = torch.randn(300, width, generator=g, dtype=torch.float64) * scale
    return x.T @ x / 300


def test_the_damped_inverse_root_squares_to_the_inverse_damped_moment():
    moment = retained_moment(torch.Generator().manual_seed(0), 7)
    root = damped_inverse_root(moment, 0.1).double()
    ridge = 0.1 * moment.diagonal().mean()
    assert torch.allclose(root @ root @ (moment + ridge * torch.eye(7, dtype=torch.float64)),
                          torch.eye(7, dtype=torch.float64), atol=1e-5)


def rare_directions(moment: torch.Tensor, k: int) -> torch.Tensor:
    """[width, k]: the retained inputs' k least used directions (the moment's last eigenvectors)."""
    return torch.linalg.eigh(moment)[1][:, :k].float()


@pytest.mark.parametrize("width", [12, 40])
def test_the_protected_subspace_is_where_an_earlier_erasure_changed_the_output_for_little_retained_energy(width):
    """Brute force: an earlier erasure that changed the output along three rarely used input directions (plus a
    small change everywhere, as Adam's per-coordinate steps leave) is protected along exactly those three, not along
    the directions every retained input uses."""
    g = torch.Generator().manual_seed(width)
    moment = retained_moment(g, width)
    rare = rare_directions(moment, 3)
    delta_w = torch.randn(5, 3, generator=g) @ rare.T + 1e-3 * torch.randn(5, width, generator=g)
    basis = protected_subspace([delta_w[:2], delta_w[2:]], damped_inverse_root(moment, 0.1), energy=0.99)
    assert basis.shape == (width, 3)
    assert torch.allclose(basis.T @ basis, torch.eye(3), atol=1e-4)
    for x in rare.T:
        assert (x - basis @ (basis.T @ x)).norm() < 1e-2
    common = torch.linalg.eigh(moment)[1][:, -1].float()  # the most used direction
    assert (basis.T @ common).norm() < 1e-2


def test_the_subspace_takes_the_fewest_directions_that_hold_the_energy_and_at_most_its_share():
    g = torch.Generator().manual_seed(3)
    identity = torch.eye(16)
    strong = torch.zeros(4, 16)
    strong[0, 0], strong[1, 1], strong[2, 2], strong[3, 3] = 10.0, 5.0, 1.0, 0.1  # energies 100, 25, 1, 0.01
    assert protected_subspace([strong], identity, energy=0.75).shape[1] == 1  # 100/126.01 >= 0.75
    assert protected_subspace([strong], identity, energy=0.9).shape[1] == 2
    assert protected_subspace([strong], identity, energy=0.999).shape[1] == 3
    flat = torch.randn(16, 16, generator=g)
    assert protected_subspace([flat], identity, energy=0.99, max_share=0.25).shape[1] == 4  # the cap


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_after_every_adamw_step_the_update_has_no_response_on_the_protected_inputs(kind):
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    width, out = 10, 6
    module = torch.nn.Linear(width, out) if kind == "linear" else Conv1D(out, width)
    anchor_module = copy.deepcopy(module)
    moment = retained_moment(g, width).float()
    erased = rare_directions(moment, 2).T  # [2, width]
    with torch.no_grad():  # an earlier erasure: a change of the output along two rarely used directions
        change = torch.randn(out, 2, generator=g) @ erased
        module.weight.add_(change.T if kind == "conv1d" else change)
    start = module.weight.detach().clone()
    anchor = torch.nn.ModuleDict({"p": anchor_module})
    constraints, summary = guard_erasures({"p": module}, anchor, {"p": moment}, 0.1)
    assert len(constraints) == 1 and summary["inputs"] == 1 and 2 <= summary["directions"] <= 2
    optimiser = torch.optim.AdamW(module.parameters(), lr=0.05)
    for _ in range(5):
        x = torch.randn(8, width, generator=g)
        module(x).pow(2).sum().backward()
        optimiser.step()
        optimiser.zero_grad()
        constraints[0]()
    moved = module.weight.detach() - start
    moved = moved.T if kind == "conv1d" else moved
    assert moved.norm() > 0.1  # it trained
    assert (moved @ erased.T).norm() < 1e-4 * moved.norm() * erased.norm()  # but not on the erased inputs


def test_nothing_is_guarded_without_an_anchor_or_a_change_since_it():
    module = torch.nn.Linear(4, 3)
    moment = torch.eye(4)
    constraints, summary = guard_erasures({"p": module}, None, {"p": moment}, 0.1)
    assert constraints == [] and summary["directions"] == 0 and "no anchor" in summary["reason"]
    same = torch.nn.ModuleDict({"p": copy.deepcopy(module)})
    constraints, summary = guard_erasures({"p": module}, same, {"p": moment}, 0.1)
    assert constraints == [] and summary["inputs"] == 0


@pytest.mark.slow
def test_a_chained_run_keeps_off_what_the_first_run_erased(fixture_model, forget_records, retain_records, tmp_path):
    """Run 1 erases records A from the root; run 2 erases records B from run 1's version, anchored to the root. With
    the guard (the default) run 2 reports the protected directions and its saved version has no response change along
    them in any whitened projection; with guard_erasures false it does change there."""
    whitened = {"max_steps": 6, "lr": 1e-3, "lora": False, "whiten_updates": True}
    first = unlearn(str(fixture_model), RunInputs.of(forget_records[:4], retain_records[:16]),
                    params=MascParams.from_dict(whitened))
    assert first.result.as_dict()["lora"]["whitened"]["guarded"]["directions"] == 0  # no anchor: nothing before it
    v1 = tmp_path / "v1"
    save_model(first.model, first.tokenizer, v1)
    start, tokenizer = load_model(v1, torch.device("cpu"))
    root, _ = load_model(fixture_model, torch.device("cpu"))
    names = lora_modules(start, "auto")
    mine, theirs = dict(start.named_modules()), dict(root.named_modules())
    retain = encode_records(normalise_records(retain_records[:16], "retain"), tokenizer, max_length=512, seed=0,
                            what="retain")
    moments = input_second_moments(start, {n: mine[n] for n in names}, retain, tokenizer.pad_token_id)

    def out_in(module: torch.nn.Module) -> torch.Tensor:
        w = module.weight.detach().float()
        return w.T if isinstance(module, Conv1D) else w

    bases = {}
    for n in names:  # each projection's own subspace (the guard stacks q, k and v: a larger one that holds these)
        bases[n] = protected_subspace([out_in(mine[n]) - out_in(theirs[n])],
                                      damped_inverse_root(moments[n], 0.1))
    inputs_b = RunInputs.of(forget_records[4:8], retain_records[:16])
    moved_along = {}
    for guard in (True, False):
        run = unlearn(str(v1), inputs_b, params=MascParams.from_dict({**whitened, "guard_erasures": guard}),
                      anchor=str(fixture_model))
        ran = run.result.as_dict()
        assert ran["params"]["guard_erasures"] is guard and ran["steps"] == 6
        guarded = ran["lora"]["whitened"].get("guarded")
        assert (guarded["directions"] > 0 and guarded["inputs"] == 8) if guard else guarded is None
        after = dict(run.model.named_modules())
        moved_along[guard] = max(
            ((out_in(after[n]) - out_in(mine[n])) @ bases[n]).norm().item() / (out_in(after[n]) - out_in(mine[n])
                                                                                ).norm().item() for n in names
            if n.endswith(("o_proj", "down_proj")))  # projections whose input no other one shares
    assert moved_along[True] < 1e-3 < 0.05 < moved_along[False], moved_along
