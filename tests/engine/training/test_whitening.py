"""Whitened updates (issue 28): full fine-tuning of the projections, each gradient times the inverse damped second
moment of its inputs on the retain records. Checked against a brute-force version on tiny models of two layouts
(Linear and GPT-2's transposed Conv1D), and for what it is for: a step spares the directions retained inputs use."""
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.data.records import EncodedRecord, collate
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.architectures import Size, tiny_config
from lethe.engine.model.loading import TrainableModel, load_model, lora_modules
from lethe.engine.model.lora_targets import suffixes
from lethe.engine.training.whitening import _weight_hook, input_second_moments, whiten_updates, whitening
from lethe.engine.unlearn import run_unlearning

VOCAB = 80  # no tiny model's projection size (32, 64, 96): lora_targets would take that one for a vocabulary


def records(lengths: list[int], seed: int = 0) -> list[EncodedRecord]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        out.append(EncodedRecord(f"r{i}", ids, [-100] * 2 + ids[2:], prompt_len=2))
    return out


def tiny(family: str):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(family, Size(vocab_size=VOCAB))).eval()


def test_whitening_is_the_damped_inverse_scaled_to_mean_diagonal_one():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64) * torch.tensor([3.0, 2, 1, 0.5, 0.1, 0.01])
    moment = x.T @ x / 40
    got = whitening(moment, 0.1)
    ridge = 0.1 * moment.trace().item() / 6
    expected = torch.linalg.solve(moment + ridge * torch.eye(6, dtype=torch.float64), torch.eye(6, dtype=torch.float64))
    expected = expected / expected.diagonal().mean()
    assert torch.allclose(got, expected, atol=1e-9)
    assert torch.allclose(got, got.T)
    # Large damping: the plain gradient's direction (the identity).
    assert torch.allclose(whitening(moment, 1e6), torch.eye(6, dtype=torch.float64), atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_second_moments_are_over_real_tokens_only(family):
    model = tiny(family)
    names = lora_modules(model, "auto")
    named = dict(model.named_modules())
    modules = {n: named[n] for n in names}
    chosen = records([9, 4, 7, 12, 5])
    got = input_second_moments(model, modules, chosen, pad_id=0, batch_size=3)  # padded batches
    # Brute force: each record alone (no padding), every position's input kept.
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = [m.register_forward_pre_hook(lambda _m, inp, n=n: seen[n].append(inp[0].reshape(-1, inp[0].shape[-1])))
               for n, m in modules.items()]
    with torch.no_grad():
        for r in chosen:
            model(input_ids=torch.tensor([r.input_ids]), use_cache=False)
    for h in handles:
        h.remove()
    assert set(got) == set(names)
    for n in names:
        x = torch.cat(seen[n]).double()
        assert x.shape[0] == sum(len(r.input_ids) for r in chosen)
        assert torch.allclose(got[n].double(), x.T @ x / len(x), rtol=1e-4, atol=1e-6), n


def test_projections_reading_the_same_input_share_one_moment():
    model = tiny("llama")
    names = lora_modules(model, "auto")
    assert len(names) == 14  # seven projections in each of two blocks: the MLP's are not taken for a vocabulary
    named = dict(model.named_modules())
    got = input_second_moments(model, {n: named[n] for n in names}, records([9, 4, 7]), pad_id=0, batch_size=2)

    def moment(layer: int, leaf: str) -> torch.Tensor:
        return got[next(n for n in names if f".{layer}." in n and n.endswith(leaf))]

    for i in (0, 1):
        assert moment(i, "q_proj") is moment(i, "k_proj") is moment(i, "v_proj")
        assert moment(i, "gate_proj") is moment(i, "up_proj")
        assert len({id(moment(i, leaf)) for leaf in ("q_proj", "o_proj", "gate_proj", "down_proj")}) == 4
        assert not torch.allclose(moment(i, "q_proj"), moment(i, "gate_proj"))  # attention's input is not the MLP's


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_each_projection_trains_on_its_whitened_gradient_and_nothing_else_trains(family):
    model = tiny(family)
    plain = copy.deepcopy(model)
    trainable = TrainableModel(model, lora=False)
    names = lora_modules(model, "auto")
    retain = records([8, 6, 10, 7], seed=2)
    report = whiten_updates(trainable, names, retain, pad_id=0, damping=0.1)
    # Four distinct inputs a block: llama's q, k, v share one, gate and up one; GPT-2 fuses them.
    assert report == {"modules": suffixes(names), "projections": len(names), "inputs": 8, "records": 4,
                      "damping": 0.1, "guarded": {"inputs": 0, "directions": 0, "capped": 0,
                                                  "reason": "no anchor: nothing erased before this run"}}
    assert trainable.whitened == report and trainable.describe() == {"mode": "full", "whitened": report}
    named = dict(trainable.model.named_modules())
    moments = input_second_moments(plain, {n: dict(plain.named_modules())[n] for n in names}, retain, 0)
    batch = collate(records([9, 5], seed=3), 0)
    for m in (trainable.model, plain):
        m(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels, use_cache=False
          ).loss.backward()
    plain_named = dict(plain.named_modules())
    for n in names:
        inverse = whitening(moments[n], 0.1)
        raw = plain_named[n].weight.grad
        transposed = type(plain_named[n]).__name__ == "Conv1D"
        expected = inverse @ raw if transposed else raw @ inverse
        assert torch.allclose(named[n].weight.grad, expected, rtol=1e-4, atol=1e-7), n
        assert not torch.allclose(named[n].weight.grad, raw, atol=1e-6), n  # it did change the gradient
    projections = {f"{n}.{leaf}" for n in names for leaf in ("weight", "bias")}
    for name, parameter in trainable.model.named_parameters():
        assert parameter.requires_grad == (name in projections), name


def test_a_whitened_step_spares_the_directions_retained_inputs_use():
    """One Linear, retained inputs with most of their energy in 6 of 8 directions, a forget input with a part of its
    own: for the same change of the output on the forget input, the whitened step changes the outputs on the retained
    inputs several times less than the plain gradient step."""
    g = torch.Generator().manual_seed(4)
    scale = torch.tensor([1.0] * 6 + [0.05] * 2)
    retained = torch.randn(200, 8, generator=g) * scale
    forget = torch.randn(8, generator=g) * scale + torch.tensor([0.0] * 6 + [1.0, -1.0])
    weight = torch.randn(4, 8, generator=g)
    target = torch.randn(4, generator=g)
    w = weight.clone().requires_grad_(True)
    ((w @ forget - target) ** 2).sum().backward()
    raw = w.grad.clone()
    moved = {}
    for name, step in (("plain", raw), ("whitened", _weight_hook(whitening(retained.T @ retained / 200, 0.1),
                                                                 False)(raw))):
        step = step / (step @ forget).norm()  # the same change on the forget input
        moved[name] = (retained @ step.T).norm(dim=1).mean().item()
    assert moved["whitened"] < moved["plain"] / 3, moved


def test_whitened_updates_need_full_fine_tuning():
    with pytest.raises(EngineInputError, match="lora false"):
        MascParams.from_dict({"whiten_updates": True, "lora": True})
    assert MascParams.from_dict({"whiten_updates": True, "lora": False}).whiten_updates
    assert MascParams.from_dict({"whiten_updates": True}).lora == "auto"  # the default: decided at the run
    with pytest.raises(EngineInputError, match="whiten_damping"):
        MascParams.from_dict({"whiten_updates": True, "lora": False, "whiten_damping": 0})


def test_whiten_updates_refuses_lora_and_a_run_without_retain_records():
    trainable = TrainableModel(tiny("llama"), lora=True)
    with pytest.raises(EngineInputError, match="lora false"):
        whiten_updates(trainable, [], records([5]), 0, 0.1)
    with pytest.raises(EngineInputError, match="retain records"):
        whiten_updates(TrainableModel(tiny("llama"), lora=False), [], [], 0, 0.1)
    with pytest.raises(EngineInputError, match="linear projection"):  # an embedding has a 2-D weight, no inputs
        whiten_updates(TrainableModel(tiny("llama"), lora=False), ["model.embed_tokens"], records([5]), 0, 0.1)


def test_a_projection_the_method_froze_stays_frozen():
    trainable = TrainableModel(tiny("llama"), lora=False)
    trainable.restrict_training(["mlp.down_proj"])  # as RMU trains only the MLP output projections
    names = [n for n, m in trainable.model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
    assert whiten_updates(trainable, names, records([6, 7]), 0, 0.1)["projections"] == 2  # two layers' down_proj
    trained = {n for n, p in trainable.model.named_parameters() if p.requires_grad}
    assert trained and all(".mlp.down_proj." in n for n in trained), trained


@pytest.mark.slow
def test_a_whitened_run_moves_only_the_projections(fixture_model, forget_records, retain_records):
    params = MascParams.from_dict({"lora": False, "whiten_updates": True, "max_steps": 10, "lr": 1e-3})
    outcome = run_unlearning(str(fixture_model), forget_records[:4], retain_records[:12], params=params)
    assert outcome.result.steps > 0
    base, _ = load_model(fixture_model, torch.device("cpu"))
    names = set(lora_modules(base, "auto"))
    after = dict(outcome.model.named_parameters())
    moved = {n for n, p in base.named_parameters() if not torch.equal(p, after[n])}
    assert moved, "the run changed nothing"
    assert all(n.rsplit(".", 1)[0] in names for n in moved), sorted(moved)[:5]
