"""One contract (issue 13): the method registry, parameters declared once (help, range, default) and read by
validation, the CLI and the API schema alike, and the job specification that is checked once and then trusted."""
import ast
import dataclasses
import math
from pathlib import Path

import pytest

from lethe.engine.__main__ import build_parser
from lethe.engine.connectivity.params import MARGIN_FIELDS, ConnectivityParams
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.parameters import Rule, help_of, json_schema, rule_of, user_fields
from lethe.engine.job_spec import JobSpec
from lethe.engine.methods import METHODS, get_method, params_for, register_method
from tests.engine.methods.toy_method import TOY

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def toy_method():
    register_method(TOY)
    yield TOY
    del METHODS[TOY.name]


def test_every_parameter_of_every_method_says_what_it_does():
    for cls in {m.params for m in METHODS.values()} | {ConnectivityParams}:
        for f in user_fields(cls):
            assert len(f.metadata.get("help", "")) > 10, (cls.__name__, f.name)


def test_every_objective_is_importable_with_a_loss():
    for method in METHODS.values():
        assert callable(method.objective_class().loss), method.name


def test_nothing_outside_the_registry_lists_the_methods():
    """A module that names three or more baselines in string literals keeps its own list of them (MASC, the
    default, is named where it is the default; the benchmarks name the two baselines issue 5 compares)."""
    names = set(METHODS) - {"masc"}
    registry = ROOT / "lethe" / "engine" / "methods" / "__init__.py"
    # A comparison an issue names, method by method, is not a list of the methods: issue 15's GPU benchmark.
    compares = {ROOT / "bench" / "bench_gpu.py"}
    offenders = {}
    for path in [*ROOT.glob("lethe/**/*.py"), *ROOT.glob("bench/*.py")]:
        if path == registry or path in compares:
            continue
        found = {n.value for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Constant) and n.value in names}
        if len(found) >= 3:
            offenders[str(path.relative_to(ROOT))] = sorted(found)
    assert offenders == {}


@pytest.mark.parametrize("rule,message", [
    (Rule(ge=1, le=4096), "must lie in [1, 4096]"), (Rule(gt=0, lt=1), "must lie in (0, 1)"),
    (Rule(gt=0, le=1), "must lie in (0, 1]"), (Rule(ge=0), "must be >= 0"), (Rule(gt=0), "must be > 0"),
    (Rule(ge=0, note="0: off"), "must be >= 0 (0: off)"),
    (Rule(gt=0, lt=1, auto=True), 'must be "auto" or lie in (0, 1)'),
    (Rule(ge=0, auto=True), 'must be "auto" or >= 0'), (Rule(choices=("kl", "nll")), "must be 'kl' or 'nll'"),
    (Rule(choices=(True, False, "auto")), 'must be true, false or "auto"'),
    (Rule(ge=1, le=1_000_000), "must lie in [1, 1000000]"),
])
def test_rules_say_what_they_allow(rule, message):
    assert rule.describe() == message


def test_rules_agree_with_a_brute_force_check():
    rules = [Rule(ge=0, le=1), Rule(gt=0, lt=1), Rule(gt=-1), Rule(le=5), Rule(gt=0, auto=True)]
    values = [-2, -1, -0.5, 0, 1e-9, 0.5, 1, 1.5, 5, 6, "auto", "x", True]
    for rule in rules:
        for v in values:
            if v == "auto" or isinstance(v, (str, bool)):
                expected = v == "auto" and rule.auto
            else:
                expected = all(ok for ok in (rule.ge is None or v >= rule.ge, rule.gt is None or v > rule.gt,
                                             rule.le is None or v <= rule.le, rule.lt is None or v < rule.lt))
            assert rule.allows(v) == expected, (rule, v)


def _schema_cases():
    for method in METHODS.values():
        for name, prop in method.schema()["properties"].items():
            yield method.name, name, prop


@pytest.mark.parametrize("method,name,prop", list(_schema_cases()))
def test_the_api_schema_and_the_engine_agree_on_every_bound(method, name, prop):
    """The schema's default passes the engine; each bound it states is where the engine starts refusing."""
    params_for(method, {name: prop["default"]})
    number = next((p for p in prop.get("anyOf", [prop]) if p.get("type") in ("number", "integer")), None)
    if number is None:
        return
    step = 1 if number["type"] == "integer" else 1e-9
    for key, inside, outside in (("minimum", 0, -step), ("exclusiveMinimum", step, 0),
                                 ("maximum", 0, step), ("exclusiveMaximum", -step, 0)):
        if key not in number:
            continue
        bound = number[key]
        for delta, accepted in ((inside, True), (outside, False)):
            value = bound + delta
            value = int(value) if number["type"] == "integer" else value
            # effective_batch >= batch_size ties the two: move the other out of the way
            extra = ({"effective_batch": 4096} if name == "batch_size" and method != "masc" else
                     {"batch_size": 1} if name == "effective_batch" else {})
            if accepted:
                params_for(method, {name: value, **extra})
            else:
                with pytest.raises(EngineInputError, match=name):
                    params_for(method, {name: value, **extra})


def test_help_shows_the_rule_and_the_cli_shows_the_help():
    rho = next(f for f in dataclasses.fields(get_method("masc").params) if f.name == "rho")
    assert help_of(rho).endswith("((0, 1))") and rule_of(rho) == Rule(gt=0, lt=1)
    unlearn = build_parser()._subparsers._group_actions[0].choices["unlearn"]  # noqa: SLF001
    flags = {a.dest: a for a in unlearn._actions}  # noqa: SLF001
    assert flags["rho"].help.startswith(help_of(rho)) and "[default: 0.5]" in flags["rho"].help
    assert "npo, npo_kl, rmu 0.1" in flags["beta"].help and "simnpo 4.5" in flags["beta"].help
    assert "masc 1.0" in flags["beta"].help
    assert all(f"{name}: " in flags["method"].help for name in METHODS)
    assert all(name in flags["preset"].help for name in get_method("masc").presets)


def test_a_new_method_is_one_module_and_one_registration(toy_method):
    from lethe.service.api.app import create_app

    params = params_for("toy_ascent", {"epochs": 3})
    assert (params.method, params.forget_weight, params.epochs) == ("toy_ascent", 0.5, 3.0)
    unlearn = build_parser()._subparsers._group_actions[0].choices["unlearn"]  # noqa: SLF001
    assert "toy_ascent: " in {a.dest: a for a in unlearn._actions}["method"].help  # noqa: SLF001
    schema = create_app().openapi()["components"]["schemas"]["JobCreate"]["properties"]
    assert "toy_ascent" in schema["method"]["enum"]
    assert "toy_ascent parameters" in [s.get("title") for s in schema["params"]["anyOf"]]


def test_a_job_specification_is_resolved_once_and_stored_whole():
    spec = JobSpec.unlearning("masc", {"k": 3}, "tofu-llama2", {"points": 5, "fit_steps": 2})
    stored = spec.stored()
    assert stored["method"] == "masc" and stored["preset"] == "tofu-llama2"
    assert stored["params"]["rho"] == 0.7 and stored["params"]["k"] == 3 and stored["params"]["batch_size"] == 2
    assert set(stored["params"]) == {f.name for f in dataclasses.fields(get_method("masc").params)}
    # The curves measure V with the job's own margin.
    assert {n: stored["connectivity"][n] for n in MARGIN_FIELDS} == {"k": 3, "rho": 0.7, "eta": 0.25, "beta": 1.0}
    assert JobSpec.from_stored(stored) == spec
    baseline = JobSpec.unlearning("npo", {"lora": False}).stored()["params"]
    # lr 0 is stored as asked; the run resolves it (1e-5 in full), once, with every other "auto".
    assert baseline["lr"] == 0 and baseline["beta"] == 0.1 and baseline["method"] == "npo"
    assert JobSpec.from_stored(JobSpec.unlearning("npo", {"lora": False}).stored()).params.resolved().lr == 1e-5
    assert JobSpec.unlearning("graddiff", {}, None, {}).connectivity.rho == 0.5  # the baselines' yardstick


def test_a_stored_specification_is_trusted_not_checked_again():
    stored = JobSpec.unlearning("masc").stored()
    stored["params"]["rho"] = 7.0  # written by hand into the database: the worker runs what is stored
    assert JobSpec.from_stored(stored).params.rho == 7.0


@pytest.mark.parametrize("args,field", [
    (("masc", {"lr": 2.0}), "params.lr"), (("masc", {"gamma": 1}), "params.gamma"),
    (("masc", {}, "llama-9000"), "preset"), (("dpo", {}), "method"), (("npo", {"alpha": 0.1}), "params.alpha"),
    (("masc", {}, None, {"space": "diag"}), "mcu.space"), (("masc", {}, None, {"nope": 1}), "mcu.nope"),
    (("masc", {}, None, {"k": 3}), "mcu.k"), (("npo", {}, None, {"rho": 0.3}), "mcu.rho"),
])
def test_a_bad_specification_names_its_field(args, field):
    with pytest.raises(EngineInputError) as caught:
        JobSpec.unlearning(*args)
    assert caught.value.field == field


def test_connectivity_parameters_in_the_schema_match_the_engine():
    schema = json_schema(ConnectivityParams)["properties"]
    assert schema["points"]["minimum"] == 3 and schema["points"]["maximum"] == 101
    assert schema["curve"]["enum"] == ["linear", "bezier"] and schema["points"]["default"] == 11
    assert all(math.isfinite(p.get("minimum", 0)) for p in schema.values())
