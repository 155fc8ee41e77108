"""Mode connectivity (SPEC section 6): paths, the control point's gradient, barriers on known
landscapes, the suppress-first crossing, the ensemble, and a connectivity run on two fixture versions."""
import math

import pytest
import torch

from lethe.engine.audit.measurements import EvaluationSet
from lethe.engine.connectivity.barriers import barriers, crossing, suppress_first
from lethe.engine.connectivity.curve import loss_and_violation
from lethe.engine.connectivity.fit import fit_control_point, path_loss
from lethe.engine.connectivity.params import ConnectivityParams
from lethe.engine.connectivity.paths import ControlPoint, Path, bezier_coefficients, differing_names, parameters_of
from lethe.engine.connectivity.run import run_connectivity
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.inputs import RunInputs
from lethe.engine.data.records import collate, encode_records
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.loading import load_model, save_model
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


@pytest.fixture(scope="module")
def versions(fixture_model, forget_records, retain_records, tmp_path_factory):
    """Version 1: the fixture; version 2: MASC on the forget set (LoRA, merged)."""
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records,
                             params=MascParams.from_dict({"lr": 1e-3, "max_steps": 400, "lora": True}))
    out = tmp_path_factory.mktemp("mcu") / "v2"
    save_model(outcome.model, outcome.tokenizer, out)
    return fixture_model, out


def encoded(tokenizer, records, what):
    return encode_records(normalise_records(records, what), tokenizer, max_length=512, seed=0, what=what)


def test_bezier_coefficients_expand_the_quadratic():
    for t in (0.0, 0.1, 0.37, 0.5, 0.9, 1.0):
        c1, cc, c2 = bezier_coefficients(t)
        assert math.isclose(c1 + cc + c2, 1.0)
        # B(t) = (1-t)^2 a + 2t(1-t) c + t^2 b, checked on scalars against the expanded polynomial.
        a, c, b = 2.0, -3.0, 5.0
        assert math.isclose(c1 * a + cc * c + c2 * b, a + 2 * t * (c - a) + t * t * (a - 2 * c + b))
    assert bezier_coefficients(0.0) == (1.0, 0.0, 0.0)
    assert bezier_coefficients(1.0) == (0.0, 0.0, 1.0)


def two_models(versions):
    a, tokenizer = load_model(versions[0], torch.device("cpu"))
    b, _ = load_model(versions[1], torch.device("cpu"))
    return a, b, tokenizer


@pytest.mark.parametrize("space", ["full", "lora"])
def test_endpoints_reproduce_the_versions_and_the_control_point_gets_gradient(versions, space, forget_records,
                                                                              retain_records):
    a, b, tokenizer = two_models(versions)
    start, end = parameters_of(a), parameters_of(b)
    names = differing_names(start, end)
    # LoRA on the attention and MLP projections: only those matrices moved.
    assert names and all(n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                     "gate_proj.weight", "up_proj.weight", "down_proj.weight")) for n in names)
    start = {n: start[n].clone() for n in names}
    control = ControlPoint(start, end, names, space, rank=4)
    with torch.no_grad():  # move theta_c off the midpoint, so the endpoints are tested with a real bend
        for p in control.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = Path(start, end, names, "bezier", control)
    for n, w in path.weights(0.0).items():
        assert torch.equal(w, start[n])
    for n, w in path.weights(1.0).items():
        assert torch.equal(w, end[n])
    # phi(0) and phi(1) give the endpoint losses exactly: functional_call against the plain models.
    params = ConnectivityParams()
    retain = collate(encoded(tokenizer, retain_records[:6], "retain"), tokenizer.pad_token_id)
    forget = collate(encoded(tokenizer, forget_records[:6], "forget"), tokenizer.pad_token_id)
    for t, model in ((0.0, a), (1.0, b)):
        with torch.no_grad():
            loss, _ = path_loss(a, path, t, None, retain, params)
            direct = torch.nn.functional.cross_entropy(
                model(input_ids=retain.input_ids, attention_mask=retain.attention_mask).logits[:, :-1].reshape(
                    -1, model.config.vocab_size), retain.labels[:, 1:].reshape(-1), ignore_index=-100)
        assert loss.item() == pytest.approx(direct.item(), abs=1e-6)
    # The control point receives a non-zero gradient; the model's own weights none.
    for p in a.parameters():
        p.requires_grad_(False)
    loss, parts = path_loss(a, path, 0.5, forget, retain, params)
    loss.backward()
    grads = [p.grad for p in control.parameters()]
    assert all(g is not None for g in grads) and sum(g.abs().sum().item() for g in grads) > 0
    assert all(p.grad is None for p in a.parameters())
    if space == "lora":  # rank-4 deltas on every differing matrix, no full copies
        assert not len(control.full) and len(control.down) == len(names)


def test_fitting_the_control_point_lowers_the_midpoint_retain_loss(versions, retain_records, forget_records):
    a, b, tokenizer = two_models(versions)
    start, end = parameters_of(a), parameters_of(b)
    names = differing_names(start, end)
    start = {n: start[n].clone() for n in names}
    params = ConnectivityParams(curve="bezier", fit_steps=30, fit_lr=1e-3, lambda_forget=0.0, batch_size=8)
    control = ControlPoint(start, end, names, "full")
    with torch.no_grad():  # start from a poor control point so that there is something to learn
        for p in control.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    path = Path(start, end, names, "bezier", control)
    retain = encoded(tokenizer, retain_records, "retain")
    batch = collate(retain[:16], tokenizer.pad_token_id)
    before = path_loss(a, path, 0.5, None, batch, params)[0].item()
    fit = fit_control_point(a, tokenizer, path, [], retain, params)
    after = path_loss(a, path, 0.5, None, batch, params)[0].item()
    assert len(fit["loss_trace"]) == 30 and after < before


def test_barriers_on_a_landscape_with_a_known_barrier():
    # Double well L(theta) = (theta^2 - 1)^2 on the line from -1 to 1: L = 0 at both ends, 1 at theta = 0.
    ts = [i / 10 for i in range(11)]
    well = lambda t: ((2 * t - 1) ** 2 - 1) ** 2  # noqa: E731
    # Forget loss that dips 0.3 below the line from 3 to 5 halfway: forgotten text coming back.
    rows = [{"t": t, "retain_nll": well(t), "forget_nll": 3 + 2 * t - 0.3 * math.sin(math.pi * t)} for t in ts]
    out = barriers(rows, tolerance=0.05)
    assert out["retain"]["value"] == pytest.approx(1.0) and out["retain"]["t"] == 0.5
    assert out["forget"]["value"] == pytest.approx(0.3) and out["forget"]["t"] == 0.5
    assert out["mcu_holds"] is False
    # Signs: retain below the line and forget above it are not barriers (values <= 0): MCU holds.
    flipped = [{"t": r["t"], "retain_nll": -r["retain_nll"], "forget_nll": 3 + 2 * r["t"] + 0.3 * math.sin(
        math.pi * r["t"])} for r in rows]
    out = barriers(flipped, tolerance=0.05)
    assert out["retain"]["value"] == pytest.approx(0.0) and out["forget"]["value"] == pytest.approx(0.0)
    assert out["mcu_holds"] is True
    # Brute force: the barrier is the largest gap above the chord at the sampled points.
    gaps = [r["retain_nll"] - ((1 - r["t"]) * rows[0]["retain_nll"] + r["t"] * rows[-1]["retain_nll"]) for r in rows]
    assert barriers(rows, 0.05)["retain"]["per_point"] == pytest.approx(gaps)
    missing = barriers([{"t": 0.0, "retain_nll": 1.0}, {"t": 1.0, "retain_nll": 1.0}], 0.05)
    assert missing["mcu_holds"] is None and "forget_nll was not measured" in missing["reason"]


def test_suppress_first_crossing_against_dense_interpolation():
    ts = [i / 10 for i in range(11)]
    verbatim = [1.0, 1.0, 0.95, 0.8, 0.5, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1]
    knowledge = [0.6, 0.55, 0.3, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]
    rows = [{"t": t, "rouge_l": v, "knowledge_rouge_l": k} for t, v, k in zip(ts, verbatim, knowledge)]
    out = suppress_first(rows, 0.5, 0.02)

    def dense(values):  # brute force: walk t in steps of 1e-5 along the piecewise-linear curve
        threshold = values[-1] + 0.5 * (values[0] - values[-1])
        for j in range(100_001):
            t = j / 100_000
            i = min(int(t * 10), 9)
            v = values[i] + (values[i + 1] - values[i]) * (t * 10 - i)
            if v <= threshold + 1e-12:
                return t
    assert out["verbatim"]["t"] == pytest.approx(dense(verbatim), abs=2e-5)
    assert out["knowledge"]["t"] == pytest.approx(dense(knowledge), abs=2e-5)
    assert out["first"] == "knowledge"
    flat = crossing([{"t": 0.0, "rouge_l": 0.2}, {"t": 1.0, "rouge_l": 0.19}], "rouge_l", 0.5, 0.02)
    assert flat["t"] is None and "did not fall" in flat["reason"]


def test_ensemble_is_the_average_of_the_sampled_weights(versions):
    a, b, _ = two_models(versions)
    start, end = parameters_of(a), parameters_of(b)
    names = differing_names(start, end)
    control = ControlPoint(start, end, names, "full")
    with torch.no_grad():
        for p in control.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = Path(start, end, names, "bezier", control)
    ensemble = path.ensemble(5)
    middle = {n: v.detach() for n, v in control.tensors().items()}
    for n in names:  # brute force: the five interior points by the formula, summed one by one
        total = torch.zeros_like(start[n])
        for t in (1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6):
            total += (1 - t) ** 2 * start[n] + 2 * t * (1 - t) * middle[n] + t ** 2 * end[n]
        assert torch.allclose(ensemble[n], total / 5, atol=1e-6)
    # On the straight line the interior points are symmetric: the average is the midpoint.
    linear = Path(start, end, names, "linear").ensemble(5)
    for n in names:
        assert torch.allclose(linear[n], (start[n] + end[n]) / 2, atol=1e-6)


def test_connectivity_run_between_two_fixture_versions(versions, forget_records, retain_records):
    params = ConnectivityParams(points=5, ensemble=True, ensemble_points=3)
    outcome = run_connectivity(str(versions[0]), str(versions[1]), RunInputs.of(forget_records, retain_records), params)
    r = outcome.result
    assert [p["t"] for p in r["points"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    # The ends are the versions themselves: measured directly, the same numbers.
    for model_dir, row in ((versions[0], r["points"][0]), (versions[1], r["points"][-1])):
        model, tokenizer = load_model(model_dir, torch.device("cpu"))
        forget = EvaluationSet(normalise_records(forget_records, "forget"), tokenizer, 512, 0, "forget")
        direct = loss_and_violation(model, forget.main, tokenizer.pad_token_id, params, violation=True)
        assert row["forget_nll"] == pytest.approx(direct["nll"], abs=1e-6)
        assert row["violation_rate"] == pytest.approx(direct["violation_rate"], abs=1e-9)
    first, last = r["points"][0], r["points"][-1]
    assert first["forget_nll"] < last["forget_nll"] and first["rouge_l"] > last["rouge_l"]
    assert first["violation_rate"] > last["violation_rate"]
    b = r["barriers"]
    assert b["retain"]["value"] is not None and b["forget"]["value"] is not None
    assert b["mcu_holds"] == (b["retain"]["value"] <= 0.05 and b["forget"]["value"] <= 0.05)
    assert r["suppress_first"]["verbatim"]["t"] is not None
    assert all("knowledge_rouge_l" in p for p in r["points"])
    # The ensemble model holds the weight average of the three interior points (t = 1/4, 1/2, 3/4): the midpoint.
    a, _, _ = two_models(versions)
    start, end = parameters_of(a), parameters_of(load_model(versions[1], torch.device("cpu"))[0])
    for n, w in parameters_of(outcome.ensemble).items():
        assert torch.allclose(w, (start[n] + end[n]) / 2, atol=1e-6)


def test_bezier_run_reports_the_fit_and_the_linear_suppress_analysis(versions, forget_records, retain_records):
    params = ConnectivityParams(curve="bezier", points=3, fit_steps=5, lora_r=2)  # space auto: LoRA-derived ends
    inputs = RunInputs.of(forget_records, retain_records)
    r = run_connectivity(str(versions[0]), str(versions[1]), inputs, params).result
    assert r["space"] == "lora" and len(r["fit"]["loss_trace"]) == 5
    assert len(r["suppress_points"]) == 3 and "fit_seconds" in r["timing"]


def test_bad_mcu_parameters_name_the_field():
    for values, field in (({"curve": "cubic"}, "curve"), ({"points": 2}, "points"), ({"tolerance": -1}, "tolerance"),
                          ({"nope": 1}, "nope"), ({"points": "eleven"}, "points"), ({"ensemble": 1}, "ensemble")):
        with pytest.raises(EngineInputError) as caught:
            ConnectivityParams.from_dict(values)
        assert caught.value.field == field


def test_auto_space_is_lora_only_when_just_adapted_matrices_differ():
    from lethe.engine.connectivity.run import choose_space

    weights = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4),
               "model.layers.0.mlp.down_proj.weight": torch.zeros(4, 4), "model.norm.weight": torch.zeros(4),
               "model.embed_tokens.weight": torch.zeros(8, 4)}
    adaptable = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"}
    assert choose_space("auto", ["model.layers.0.self_attn.q_proj.weight"], weights, adaptable) == "lora"
    assert choose_space("auto", ["model.layers.0.self_attn.q_proj.weight",
                                 "model.layers.0.mlp.down_proj.weight"], weights, adaptable) == "lora"
    assert choose_space("auto", ["model.layers.0.self_attn.q_proj.weight",
                                 "model.embed_tokens.weight"], weights, adaptable) == "full"
    assert choose_space("auto", ["model.norm.weight"], weights, adaptable) == "full"
    assert choose_space("full", ["model.layers.0.self_attn.q_proj.weight"], weights, adaptable) == "full"
