"""MASC on a fixture model that memorised a synthetic QA set: stops by its rule, forgets, keeps the rest."""
import json
import subprocess
import sys

import pytest
import torch

from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import collate, encode_records
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import AS_PUBLISHED, MascParams
from lethe.engine.model.fixture import FixtureConfig, build_fixture
from lethe.engine.model.generation import exact_match
from lethe.engine.model.loading import TrainableModel, load_model, save_model
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

# The tiny fixture learns fast; 1e-3 keeps a run to a few hundred steps where the defaults are not the point.
FAST = dict(lr=1e-3, max_steps=1000)


def encoded(tokenizer, records, what):
    return encode_records(normalise_records(records, what), tokenizer, max_length=512, seed=0, what=what)


@pytest.fixture(scope="module")
def unlearned(fixture_model, forget_records, retain_records):
    """A job with no parameters at all: the defaults decide everything."""
    steps = []
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records, progress=steps.append)
    return outcome, steps


def test_defaults_erase_every_record_and_keep_the_rest(fixture_model, unlearned, forget_records, retain_records):
    base, tokenizer = load_model(fixture_model, torch.device("cpu"))
    forget, retain = encoded(tokenizer, forget_records, "forget"), encoded(tokenizer, retain_records, "retain")
    assert exact_match(base, tokenizer, forget)["value"] == 1.0
    before_retain = exact_match(base, tokenizer, retain)["value"]
    outcome, _ = unlearned
    r = outcome.result.as_dict()
    assert r["stop_reason"] == "alpha"
    # Every record was trained on and checked; none is reproduced; its own answers neither leak nor loop.
    assert r["validation"] == {"mode": "train", "n_train": 10, "n_val": 10}
    assert all(p["trained"] and p["meets_condition"] and not p["reproduced"] and not p["leaked"]
               and not p["looped"] for p in r["per_record"])
    assert r["erasure"]["applied"] and r["erasure"]["failing_ids"] == []
    # Those without located content are at or below their ceiling, and their mean at or below alpha.
    whole = [p for p in r["per_record"] if not p["content_tokens"]]
    assert all(p["violation"] <= p["ceiling"] + 1e-6 for p in whole)
    assert r["erasure"].get("judged_violation_rate") is None or r["erasure"]["judged_violation_rate"] <= \
        r["alpha"]["value"] + 1e-6
    # The rule checked the model as saved, and that is what came back.
    assert r["erasure"]["served_checks"][-1]["passed"] and r["erasure"]["served_checks"][-1]["dtype"] == "float32"
    after = exact_match(outcome.model, tokenizer, forget)
    assert after["value"] == 0.0
    assert exact_match(outcome.model, tokenizer, retain)["value"] >= 0.95 * before_retain
    # No record names its secrets: the content is what memorisation gain found, most records have some.
    content = r["secrets"]
    assert (content["suppress"], content["given"], content["unaligned"]) == ("content", 0, 0)
    assert content["by_gain"] >= 5 and content["by_gain"] + content["none"] == 10
    assert set(content["replayed_ids"]) == {f["id"] for f in forget_records}  # every record's own answers
    assert r["params"]["lambda_retain"] == 3.0 and r["params"]["suppress"] == "content"
    # With retain records and room, the default trains the whole model with whitened updates (lora "auto"), on the
    # architecture's projections found on its own.
    assert (r["params"]["lora"], r["params"]["whiten_updates"], r["params"]["lora_targets"]) == (False, True, "auto")
    assert set(r["lora"]["whitened"]["modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"}


def test_auto_alpha_is_theta0_violation_on_the_records_counterfactuals(fixture_model, unlearned, forget_records):
    """The calibrated target, recomputed by hand: theta_0's v on every perturbed completion, per record (at least the
    template's share of a record whose content is located); alpha the mean over the records judged by v."""
    outcome, _ = unlearned
    r = outcome.result.as_dict()
    assert r["alpha"]["source"] == "auto"
    by_source = r["erasure"]["ceilings"]["by_source"]  # a located record's floor (its template's share) may win
    assert set(by_source) <= {"perturbed_completions", "template_share"}
    assert sum(by_source.values()) == len(forget_records)
    base, tokenizer = load_model(fixture_model, torch.device("cpu"))
    trainable = TrainableModel(base, lora=True)  # adapters start at zero: exactly theta_0
    masc = Masc(MascParams().resolved(), trainable, tokenizer.pad_token_id)
    expected = {}
    for record in forget_records:
        variants = [{"id": f"{record['id']}-{j}", "prompt": record["prompt"], "completion": c}
                    for j, c in enumerate(record["perturbed_completions"])]
        checks = masc.check_records(encoded(tokenizer, variants, "cf"), 16)
        expected[record["id"]] = sum(c.violation for c in checks) / len(checks)
    by_id = {p["id"]: p for p in r["per_record"]}
    for rid, p in by_id.items():
        if p["content_tokens"]:
            expected[rid] = max(expected[rid], 1 - p["content_tokens"] / p["active_tokens"])
    assert {rid: p["ceiling"] for rid, p in by_id.items()} == pytest.approx(expected, abs=1e-6)
    judged = [rid for rid, p in by_id.items() if not p["content_tokens"]] or list(by_id)
    assert r["alpha"]["value"] == pytest.approx(sum(expected[rid] for rid in judged) / len(judged), abs=1e-6)
    assert r["initial_violation_rate"] > 0.9  # the base reproduces everything


def test_the_published_suppression_stays_as_a_preset(fixture_model, forget_records, retain_records):
    """The preset whole-record: every token suppressed, no destination, no replay; it reaches its rule."""
    base, tokenizer = load_model(fixture_model, torch.device("cpu"))
    forget = encoded(tokenizer, forget_records, "forget")
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records,
                             params=MascParams.from_dict({"lr": 1e-3}, preset="whole-record"))
    r = outcome.result.as_dict()
    assert r["stop_reason"] == "alpha" and r["params"]["suppress"] == "whole"
    assert r["secrets"]["located"] == 0 and r["secrets"]["replayed_ids"] == []
    assert all(p["violation"] <= p["ceiling"] + 1e-6 and not p["reproduced"] for p in r["per_record"])
    assert exact_match(outcome.model, tokenizer, forget)["value"] == 0.0


def test_result_records_the_run(unlearned, forget_records):
    outcome, steps = unlearned
    r = outcome.result.as_dict()
    assert r["steps"] == len(r["loss_trace"]) == len(steps) - 1 > 0
    # A progress call each step, and a last one with the V measured at the stop.
    assert [s["step"] for s in steps] == list(range(1, r["steps"] + 1)) + [r["steps"]]
    assert steps[-1]["violation_rate"] == r["final_violation_rate"]
    assert {"forget", "retain", "total"} <= set(steps[-1]["losses"])
    assert r["v_trace"][-1]["stage"] == "confirm" and r["v_trace"][-1]["passed"]
    assert r["v_trace"][-1]["step"] == r["steps"] and r["v_trace"][-1]["n"] == len(forget_records)
    assert r["params"]["lr"] == 1e-4 and r["seed"] == 0
    assert r["versions"]["torch"] and r["versions"]["transformers"]
    assert r["peak_memory"]["bytes"] > 0 and r["wall_seconds"] > 0
    assert 0 < r["timing"]["stop_check_seconds"] < r["wall_seconds"]
    assert r["neighbours"]["count"] > 0 and r["counts"] == {"forget": 10, "retain": 30, "holdout": 0}
    assert r["own_text"] is None  # off by default
    bound = r["bound"]
    assert [b["id"] for b in bound["per_record"]] == [f["id"] for f in forget_records]
    for b in bound["per_record"]:
        assert b["bound"] == pytest.approx(0.5 ** round((1 - b["violation"]) * b["active_tokens"]))
    assert bound["aggregate"]["max_bound"] == max(b["bound"] for b in bound["per_record"])
    assert bound["aggregate"]["guaranteed"] is True
    json.dumps(r)  # serialisable as it stands


def test_final_violation_rate_is_the_full_statistic_also_at_max_steps(fixture_model, forget_records,
                                                                      retain_records):
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records,
                             params=MascParams.from_dict({"max_steps": 7, "lr": 1e-3}))
    r = outcome.result.as_dict()
    assert r["stop_reason"] == "max_steps" and r["steps"] == 7
    # Measured again here on the merged model: every record, not the last trigger's estimate.
    trainable = TrainableModel(outcome.model, lora=False)
    checks = Masc(MascParams().resolved(), trainable, outcome.tokenizer.pad_token_id).check_records(
        encoded(outcome.tokenizer, forget_records, "forget"), 16)
    assert r["final_violation_rate"] == pytest.approx(sum(c.violation for c in checks) / len(checks), abs=1e-6)
    assert [p["violation"] for p in r["per_record"]] == pytest.approx([c.violation for c in checks], abs=1e-6)
    assert r["final_violation_rate"] != r["v_trace"][-1]["v"] or r["v_trace"][-1]["step"] == 7


@pytest.mark.parametrize("word_pieces", ["first", "all"])
def test_named_secrets_narrow_the_content_and_plain_records_keep_theirs(fixture_model, forget_records,
                                                                        retain_records, word_pieces):
    """Records that name their `secrets` have exactly those as content; the others in the same request find theirs
    by memorisation gain: one default for both. Of a named word, its first token is content ("first", the default)
    or every one ("all")."""
    # The last word of each record but a pet's ("home" of "keeps a pony at home": template, every pet record says it).
    chosen = [r for r in forget_records if not r["completion"].endswith("at home.")][:5]
    named = {r["id"]: dict(r, secrets=[r["completion"].rstrip(".").split()[-1]]) for r in chosen}
    forget = [named.get(r["id"], r) for r in forget_records]
    outcome = run_unlearning(str(fixture_model), forget, retain_records,
                             params=MascParams.from_dict({"max_steps": 3, "word_pieces": word_pieces}))
    r = outcome.result.as_dict()
    by_id = {p["id"]: p for p in r["per_record"]}
    assert r["secrets"]["given"] == 5 and r["secrets"]["by_gain"] >= 1
    assert all(by_id[rid]["content_spans"] == 1 for rid in named)  # the one named word, whatever its gain
    tokenizer = outcome.tokenizer
    for rid, record in named.items():
        ids = tokenizer(" " + record["secrets"][0], add_special_tokens=False)["input_ids"]
        secret_tokens = sum(bool(tokenizer.decode([t]).strip()) for t in ids)  # not a token of the space alone
        assert by_id[rid]["content_tokens"] == (secret_tokens if word_pieces == "all" else 1)
    if word_pieces == "first":  # the fixture's vocabulary splits some of these words: the two modes differ
        assert any(sum(bool(tokenizer.decode([t]).strip()) for t in tokenizer(" " + rec["secrets"][0],
                   add_special_tokens=False)["input_ids"]) > 1 for rec in named.values())


def test_at_max_steps_the_answer_flags_are_fresh_and_decide(fixture_model, forget_records, retain_records):
    # Kept records that say none of the erased facts: an answer that says a city a kept person was born in is what a
    # model that never saw these people could say too, and is not held against it (the fixture's closed vocabulary).
    facts = {r["completion"].rstrip(".").split()[-1] for r in forget_records} - {"home"}
    kept = [r for r in retain_records if not set(r["completion"].rstrip(".").split()) & facts]
    outcome = run_unlearning(str(fixture_model), forget_records, kept,
                             params=MascParams.from_dict({"max_steps": 6, "replay_every": 3, "lr": 1e-3,
                                                          "lora": True}))
    r = outcome.result.as_dict()
    assert r["stop_reason"] == "max_steps" and r["secrets"]["located"] > 0
    # The mean the rule judged: over the records without located content.
    unlocated = [p for p in r["per_record"] if not p["content_tokens"]]
    assert r["erasure"]["judged_records"] == len(unlocated)
    # After 6 steps most records still come out of the model's own answers (every record is asked at the end, so
    # the report names them), and those fail the condition.
    assert sum(p["leaked"] for p in r["per_record"]) >= len(forget_records) // 2
    assert not any(p["meets_condition"] for p in r["per_record"] if p["leaked"] or p["looped"])


def test_holdout_mode_lists_the_records_never_trained(fixture_model, people):
    forget = [r for p in people[:4] for r in p]  # 20 records: 4 held out
    retain = [r for p in people[4:] for r in p]
    outcome = run_unlearning(str(fixture_model), forget, retain,
                             params=MascParams.from_dict({"val_mode": "holdout", "max_steps": 5, "lr": 1e-3}))
    r = outcome.result.as_dict()
    validation = r["validation"]
    assert validation["mode"] == "holdout" and validation["n_val"] == 4 and validation["n_train"] == 16
    assert len(validation["never_trained"]) == 4
    untrained = {p["id"] for p in r["per_record"] if not p["trained"]}
    assert untrained == set(validation["never_trained"])
    assert not r["erasure"]["applied"]
    # Not even through their own answers: only the records trained are replayed.
    assert not set(r["secrets"]["replayed_ids"]) & untrained and r["secrets"]["replayed_ids"]


def test_saved_model_reloads_with_identical_logits_even_without_peft(unlearned, tmp_path, retain_records):
    outcome, _ = unlearned
    save_model(outcome.model, outcome.tokenizer, tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").exists()
    batch = collate(encoded(outcome.tokenizer, retain_records[:8], "retain"), outcome.tokenizer.pad_token_id)
    with torch.no_grad():
        in_memory = outcome.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    reloaded, _ = load_model(tmp_path / "model", torch.device("cpu"))
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, in_memory)
    torch.save({"ids": batch.input_ids, "mask": batch.attention_mask}, tmp_path / "batch.pt")
    # A fresh interpreter in which importing peft fails.
    script = f"""
import sys; sys.modules['peft'] = None
import torch
from transformers import AutoModelForCausalLM
b = torch.load({str(tmp_path / 'batch.pt')!r})
m = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'model')!r}).eval()
with torch.no_grad():
    torch.save(m(input_ids=b['ids'], attention_mask=b['mask']).logits, {str(tmp_path / 'logits.pt')!r})
"""
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    assert torch.equal(torch.load(tmp_path / "logits.pt"), in_memory)


def test_cancellation_stops_cleanly_without_a_model(fixture_model, forget_records, retain_records):
    calls = []
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records,
                             params=MascParams.from_dict(FAST), progress=calls.append,
                             should_cancel=lambda: len(calls) >= 3)
    r = outcome.result.as_dict()
    assert r["stop_reason"] == "cancelled"
    assert r["steps"] == 3 and outcome.model is None
    # Even a cancelled run reports the statistic measured where it stopped.
    assert 0 <= r["final_violation_rate"] <= 1 and len(r["per_record"]) == len(forget_records)


def test_small_forget_set_cannot_be_held_out_and_says_so(fixture_model, forget_records, retain_records):
    outcome = run_unlearning(str(fixture_model), forget_records[:5], retain_records,
                             params=MascParams.from_dict({**FAST, "val_mode": "holdout"}))
    validation = outcome.result.as_dict()["validation"]
    assert validation["mode"] == "train" and validation["n_val"] == 5 and "too small" in validation["reason"]
    assert outcome.result.as_dict()["stop_reason"] == "alpha"


@pytest.mark.parametrize("values", [
    dict(lora=False, lr=5e-4, max_steps=1000),  # full fine-tuning with a frozen copy
    dict(alternatives="teacher", k=2, delta=0.5, beta=5.0, rho=0.7, lambda_forget=0.5, alpha=0.55, lr=1e-3,
         max_steps=300, **AS_PUBLISHED),  # the MUSE preset's teacher mode, whole records as published
])
def test_other_modes_reach_the_stop_rule(fixture_model, forget_records, retain_records, values):
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records,
                             params=MascParams.from_dict(values))
    r = outcome.result.as_dict()
    assert r["stop_reason"] == "alpha", r["v_trace"][-3:]
    assert r["v_trace"][0]["v"] > r["final_violation_rate"]
    assert r["bound"]["aggregate"]["guaranteed"] is (values.get("beta", 1.0) == 1.0)
    assert "upper_bound" not in r["v_trace"][-1]


def test_truncated_records_are_listed_in_the_result(fixture_model, forget_records, retain_records):
    long_prompt = {**forget_records[0], "id": "long", "prompt": "Question: " * 60 + forget_records[0]["prompt"]}
    outcome = run_unlearning(str(fixture_model), [long_prompt, *forget_records[1:]], retain_records,
                             params=MascParams.from_dict({"max_length": 64, "max_steps": 1, "lr": 1e-3}))
    assert outcome.result.as_dict()["stop_reason"] == "max_steps" and outcome.result.as_dict()["steps"] == 1
    [entry] = outcome.result.as_dict()["truncated"]
    assert entry["id"] == "long" and entry["dropped_prompt_tokens"] > 0


def test_fixture_training_is_reproducible_by_seed(tmp_path, forget_records):
    cfg = FixtureConfig(seed=5, epochs=3, vocab_size=300, hidden_size=32, layers=1, heads=2)
    build_fixture(forget_records, tmp_path / "a", cfg, log=lambda _: None)
    build_fixture(forget_records, tmp_path / "b", cfg, log=lambda _: None)
    a, _ = load_model(tmp_path / "a", torch.device("cpu"))
    b, _ = load_model(tmp_path / "b", torch.device("cpu"))
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_a_forget_weight_too_gentle_for_the_model_is_raised_until_the_rule_fires(fixture_model, forget_records,
                                                                                  retain_records):
    # Whole records: with content suppression the targets alone may get there.
    gentle = {"lambda_forget": 1e-5, "lr": 1e-3, "escalate_after": 3, **AS_PUBLISHED}
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records, params=MascParams.from_dict(gentle))
    r = outcome.result.as_dict()
    assert r["stop_reason"] == "alpha" and r["escalations"]
    weights = [e["lambda_forget"] for e in r["escalations"]]
    assert weights == [1e-5 * 2 ** (i + 1) for i in range(len(weights))]
    # Without escalation the same weight does not get there in as many steps.
    stuck = run_unlearning(str(fixture_model), forget_records, retain_records,
                           params=MascParams.from_dict({**gentle, "escalate_after": 0, "max_steps": r["steps"]}))
    assert stuck.result.as_dict()["stop_reason"] == "max_steps" and stuck.result.as_dict()["escalations"] == []
    # lambda_forget_max stops the doubling where it says (the run needed more: it stops at max_steps).
    assert len(weights) > 2
    capped = run_unlearning(str(fixture_model), forget_records, retain_records,
                            params=MascParams.from_dict({**gentle, "lambda_forget_max": 4e-5, "max_steps": r["steps"]}))
    assert [e["lambda_forget"] for e in capped.result.as_dict()["escalations"]] == [2e-5, 4e-5]
    assert capped.result.as_dict()["stop_reason"] == "max_steps"
