"""The baselines (issue 5): each runs a few steps on a fixture and lowers the forget likelihood;
RMU updates only the MLP output projections of layers l-2..l; bad parameters are refused."""
import pytest
import torch

from lethe.engine.audit.metrics.forward import token_stats
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import encode_records
from lethe.engine.methods import params_for
from lethe.engine.model.loading import load_model
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


def forget_loglik(model, tokenizer, records) -> float:
    enc = encode_records(normalise_records(records, "forget"), tokenizer, max_length=512, seed=0, what="forget")
    stats = token_stats(model, enc, tokenizer.pad_token_id)
    return sum(-s.nll_sum for s in stats) / sum(s.n for s in stats)


@pytest.fixture(scope="module")
def base(fixture_model, forget_records):
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    return model, tokenizer, forget_loglik(model, tokenizer, forget_records)


@pytest.mark.parametrize("method,values", [
    ("ga", {"lr": 1e-3}), ("graddiff", {"lr": 1e-3}), ("npo", {"lr": 1e-3}), ("npo_kl", {"lr": 1e-3}),
    ("simnpo", {"lr": 5e-3}), ("graddiff", {"lora": False, "lr": 1e-4}), ("rmu", {"lora": False, "lr": 1e-2}),
])
def test_each_baseline_lowers_forget_likelihood(method, values, fixture_model, forget_records, retain_records, base):
    _, tokenizer, before = base
    params = params_for(method, {"epochs": 8, "effective_batch": 4, **values})
    steps = []
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records, params=params,
                             progress=steps.append)
    r = outcome.result.as_dict()
    # One report per step (8 x ceil(10/4)), then the last one again with V measured at the end.
    assert r["stop_reason"] == "budget" and r["steps"] == r["budget_steps"] == len(steps) - 1 == 24
    assert steps[-1]["violation_rate"] == r["final_violation_rate"] and steps[-2]["violation_rate"] is None
    assert r["method"] == method and r["bound"]["aggregate"]["records"] == len(forget_records)
    assert forget_loglik(outcome.model, tokenizer, forget_records) < before - 0.05


def test_rmu_updates_only_the_mlp_output_projections_it_names(fixture_model, forget_records, retain_records, base):
    original = base[0].state_dict()
    params = params_for("rmu", {"lora": False, "lr": 1e-3, "epochs": 2, "effective_batch": 4, "rmu_layer": 1})
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records, params=params)
    changed = {k for k, v in outcome.model.state_dict().items() if not torch.equal(v, original[k])}
    assert changed == {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}


def test_a_method_registered_from_its_own_module_runs_in_the_shared_loop(fixture_model, forget_records,
                                                                         retain_records, base):
    """A new method is one module (tests/engine/methods/toy_method.py) and one registration: the loop, the budget, the
    measurement and the result come with it."""
    from lethe.engine.methods import METHODS, register_method
    from tests.engine.methods.toy_method import TOY

    register_method(TOY)
    try:
        outcome = run_unlearning(str(fixture_model), forget_records, retain_records,
                                 params=params_for("toy_ascent", {"lr": 5e-3, "effective_batch": 4}))
    finally:
        del METHODS[TOY.name]
    r = outcome.result
    assert (r.method, r.stop_reason, r.steps, r.params["forget_weight"]) == ("toy_ascent", "budget", 6, 0.5)
    assert r.measured.per_record is not None and len(r.measured.per_record) == len(forget_records)
    assert forget_loglik(outcome.model, base[1], forget_records) < base[2] - 0.05


def test_the_linear_schedule_warms_up_then_decays():
    from lethe.engine.training.budget import linear_schedule as schedule
    factor = schedule(warmup_steps=2, total_steps=6)
    assert [factor(s) for s in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]


@pytest.mark.parametrize("method,values,preset,message", [
    ("npo", {"alpha": 0.2}, None, "unknown parameter 'alpha' for method npo"),
    ("simnpo", {"epochs": 0}, None, "epochs"),
    ("graddiff", {}, "tofu-llama2", "method graddiff has no presets"),
    ("dpo", {}, None, "unknown method 'dpo'"),
])
def test_bad_baseline_parameters(method, values, preset, message):
    with pytest.raises(EngineInputError, match=message):
        params_for(method, values, preset)


def test_method_defaults_follow_the_spec():
    assert params_for("npo").beta == 0.1 and params_for("simnpo").beta == 4.5
    assert params_for("simnpo").forget_weight == 0.125 and params_for("rmu").retain_weight == 100.0
    assert params_for("graddiff").resolved().lr == 1e-4
    assert params_for("graddiff", {"lora": False}).resolved().lr == 1e-5
    assert params_for("graddiff", {"lr": 3e-4}).resolved().lr == 3e-4 and params_for("graddiff").lr == 0
    p = params_for("ga")
    assert (p.epochs, p.weight_decay, p.effective_batch, p.warmup_epochs) == (10.0, 0.01, 32, 1.0)
