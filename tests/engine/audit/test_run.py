"""The audit end to end on the fixture: the base remembers, the unlearned version does not, and every
section is there in the one metric shape."""
import pytest
import torch

from lethe.engine.audit.quantize import quantized_copy, quantized_in_place, rtn_int4
from lethe.engine.audit.run import run_audit
from lethe.engine.data.inputs import RunInputs
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.loading import load_model
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


def test_rtn_int4_against_a_loop():
    w = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    q = rtn_int4(w, group=4)
    for r in range(3):
        for start in range(0, 10, 4):
            block = w[r, start:start + 4]
            scale = block.abs().max() / 7
            expected = (block / scale).round().clamp(-8, 7) * scale
            assert torch.allclose(q[r, start:start + 4], expected, atol=1e-6)
    assert len(torch.unique(q[0, :4])) <= 16


def test_quantized_in_place_holds_the_copy_s_weights_while_it_runs_and_restores_the_originals():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(130, 9), torch.nn.ReLU(), torch.nn.Linear(9, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copied, scheme = quantized_copy(model)
    with quantized_in_place(model) as held:
        assert held == scheme == "int4 round-to-nearest, group 128"
        for k, v in model.state_dict().items():
            assert torch.equal(v, copied.state_dict()[k]), k
        assert not torch.equal(model[0].weight, before["0.weight"])  # it did quantise
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_gpt2_s_conv1d_is_quantised_along_its_inputs_as_a_linear_layer_would_be():
    """GPT-2 keeps its projections as Conv1D (weight inputs x outputs): a 4-bit deployment quantises them too, with
    the groups along the inputs, which is the transpose of the weight as stored."""
    from transformers.pytorch_utils import Conv1D
    torch.manual_seed(0)
    conv = Conv1D(7, 130)  # 130 inputs, 7 outputs
    linear = torch.nn.Linear(130, 7, bias=False)
    with torch.no_grad():
        conv.weight.normal_()
        linear.weight.copy_(conv.weight.t())
    model = torch.nn.Sequential(conv, torch.nn.ReLU(), linear)
    before = conv.weight.detach().clone()
    with quantized_in_place(model):
        assert torch.equal(conv.weight, rtn_int4(before.t()).t())
        assert torch.equal(conv.weight.t(), linear.weight)  # the same weights, the same 4-bit values
        assert not torch.equal(conv.weight, before)
    assert torch.equal(conv.weight, before)


@pytest.fixture(scope="module")
def audited(fixture_model, forget_records, retain_records, people):
    outcome = run_unlearning(str(fixture_model), forget_records, retain_records,
                             params=MascParams.from_dict({"lr": 1e-3, "max_steps": 400}))
    holdout = [r for r in people[2]][:5]  # non-members would be unseen records; any distinct set works here
    report = run_audit(str(fixture_model), outcome.model, outcome.tokenizer,
                       RunInputs.of(forget_records, retain_records, holdout),
                       options={"relearn": True, "quantization": True})
    return report


def test_audit_sees_the_forgetting(audited):
    before, after = audited["before"], audited["after"]
    assert before["forget_verbatim"]["exact_match"]["value"] == 1.0
    assert after["forget_verbatim"]["exact_match"]["value"] <= 0.1
    assert after["forget_verbatim"]["rouge_l_recall"]["value"] < before["forget_verbatim"]["rouge_l_recall"]["value"]
    assert after["retain_utility"]["model_utility"]["value"] > 0.5 * before["retain_utility"]["model_utility"]["value"]
    for section in ("exact_match", "rouge_l_recall", "extraction_strength", "token_accuracy"):
        m = after["forget_verbatim"][section]
        assert set(m) == {"value", "per_record"} and len(m["per_record"]) == 10
    assert "generated" not in after["forget_verbatim"]  # no forget text unless examples were asked for
    assert after["forget_truth_ratio"]["value"] is not None
    assert after["forget_knowledge"]["rouge_l_recall"]["value"] is not None


def test_audit_says_why_a_value_is_missing(audited):
    assert audited["forget_quality"]["value"] is None and "retrain reference" in audited["forget_quality"]["reason"]
    leak = audited["privleak"]["loss"]
    assert leak["reference_auc"] == 0.5 and "no retrain reference" in leak["reference"]
    assert leak["value"] == pytest.approx((leak["auc"] - 0.5) / 0.5 * 100)


def test_quantization_and_relearning_sections(audited):
    q = audited["quantization"]
    assert q["scheme"].startswith("int4") and set(q["change"]) >= {"exact_match", "rouge_l_recall"}
    points = audited["relearning"]["points"]
    assert [p["steps"] for p in points] == [0, 5, 10, 20]
    # Two folds, the halves swapped: every record measured after relearning on the others.
    assert audited["relearning"]["relearn_records"] == 5 and audited["relearning"]["measured_records"] == 10
    assert set(audited["relearning"]["per_record"]) == set(audited["after"]["forget_verbatim"]["exact_match"][
        "per_record"]) and audited["relearning"]["dtype"] == "float32"


def suppressed_in_bfloat16(fixture_model, forget_records):
    """The fixture model with its forget records merely suppressed (gradient ascent until no record is reproduced),
    saved as a bfloat16 checkpoint would be."""
    from lethe.engine.audit.metrics.text import generation_metrics
    from lethe.engine.contract.record_checks import normalise_records
    from lethe.engine.data.records import collate, encode_records
    from lethe.engine.methods.masc.margin import active_positions, token_nll

    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    records = encode_records(normalise_records(forget_records, "forget"), tokenizer, max_length=128, seed=0,
                             what="forget")
    references = {r.id: tokenizer.decode(r.input_ids[r.prompt_len:], skip_special_tokens=True) for r in records}
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = collate(records, tokenizer.pad_token_id)
    for _ in range(100):
        z, y, _ = active_positions(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                                   batch.labels)
        optimiser.zero_grad()
        (-token_nll(z, y)).backward()
        optimiser.step()
        if generation_metrics(model, tokenizer, records, references)["exact_match"]["value"] == 0:
            break
    model = model.to(torch.bfloat16)
    assert generation_metrics(model, tokenizer, records, references)["exact_match"]["value"] == 0
    return model, tokenizer, records, references


def test_the_relearning_probe_trains_a_bfloat16_checkpoint_and_brings_back_what_was_only_suppressed(
        fixture_model, forget_records):
    from lethe.engine.audit.relearn import relearning_probe

    model, tokenizer, records, references = suppressed_in_bfloat16(fixture_model, forget_records)
    probe = relearning_probe(model, tokenizer, records, references, lr=1e-4)
    assert probe["points"][-1]["exact_match"] > 0 and sum(probe["per_record"].values()) >= 1  # records came back
    # At the default lr 1e-5 the bfloat16 weights themselves would not move (every update rounds away, and the
    # probe's measurements stay exactly those of step 0); the float32 copy learns.
    default = relearning_probe(model, tokenizer, records, references)
    assert default["points"][-1]["rouge_l_recall"] > default["points"][0]["rouge_l_recall"]
    assert next(model.parameters()).dtype == torch.bfloat16  # the checkpoint itself is untouched


def test_forget_quality_against_a_reference(fixture_model, forget_records, retain_records):
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    report = run_audit(str(fixture_model), model, tokenizer, RunInputs.of(forget_records, retain_records),
                       options={"relearn": False, "quantization": False, "examples": True},
                       reference_source=str(fixture_model))
    # The model against itself as the reference: identical truth ratios, KS p-value 1.
    assert report["forget_quality"]["value"] == pytest.approx(1.0)
    assert report["privleak"]["loss"]["value"] is None
    assert "quantization" not in report and "relearning" not in report  # switched off
    # The reference's own per-record figures, the verdict's floors: the model against itself leaks what it leaks.
    figures = report["reference_figures"]
    assert figures["exact_match"] == report["after"]["forget_verbatim"]["exact_match"]["per_record"]
    assert figures["sampled"] == report["after"]["forget_secrets"]["sampled"]["per_record"]
    generated = report["after"]["forget_verbatim"]["generated"]  # examples were asked for
    assert generated[forget_records[0]["id"]].strip() == forget_records[0]["completion"]


def test_a_reference_with_its_own_tokenizer_is_measured_through_it(fixture_model, forget_records, retain_records,
                                                                   tmp_path):
    from lethe.engine.model.fixture import FixtureConfig, build_fixture

    # A "retrain" on the retain records alone, with a tokenizer of its own (other token ids).
    build_fixture(retain_records, tmp_path / "reference",
                  FixtureConfig(epochs=30, vocab_size=450, hidden_size=64, layers=2, heads=4), log=lambda _: None)
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    _, ref_tokenizer = load_model(tmp_path / "reference", torch.device("cpu"))
    assert ref_tokenizer.get_vocab() != tokenizer.get_vocab()
    report = run_audit(str(fixture_model), model, tokenizer,
                       RunInputs.of(forget_records, retain_records, retain_records[:8]),
                       options={"relearn": False, "quantization": False},
                       reference_source=str(tmp_path / "reference"))
    # The memorising model and a model that never saw the forget set differ: a small KS p-value.
    assert 0 <= report["forget_quality"]["value"] < 0.5
    leak = report["privleak"]["loss"]
    assert leak["reference"] == "retrain reference"
    # The holdout here is the reference's own training data, so to the reference the forget records look far
    # less like members than the holdout: MUSE's AUC 1, and PrivLeak relative to it.
    assert leak["reference_auc"] == 1.0 and leak["value"] == pytest.approx((leak["auc"] - 1.0) * 100)


def test_extraction_and_degeneration_sections(audited):
    """The synthetic people carry no `secrets`: extracted ones (their cities, jobs, ...) are audited,
    under every probe, before and after, by record id; and the answers' fluency is measured."""
    assert audited["secrets"]["extracted"] > 0 and audited["secrets"]["given"] == 0
    before, after = audited["before"]["forget_secrets"], audited["after"]["forget_secrets"]
    assert before["greedy"]["value"] == 1.0 and len(before["greedy"]["leaking_ids"]) == audited["secrets"]["extracted"]
    assert after["greedy"]["value"] < before["greedy"]["value"]
    assert after["sampled"]["samples_per_record"] == 10 and 0 <= after["sampled"]["value"] <= 1
    assert after["paraphrased"]["value"] is not None  # the records carry paraphrased prompts
    assert "value" in audited["quantization"]["forget_secrets"]
    assert (audited["quantization"]["forget_secrets_before"]["value"]
            >= audited["quantization"]["forget_secrets"]["value"])
    assert all("secret_leak" in p and "leaking_ids" in p for p in audited["relearning"]["points"])
    for name in ("forget", "paraphrased", "retain"):
        section = audited["after"]["degeneration"][name]
        assert 0 <= section["loop_share"]["value"] <= 1 and section["perplexity_under_base"]["value"] >= 1
    assert audited["before"]["degeneration"]["forget"]["loop_share"]["value"] == 0  # the base says its records
    assert "answers" not in audited["after"] and "tokens" not in audited["after"]["forget_verbatim"]


def test_the_utility_set_is_measured_before_and_after(fixture_model, forget_records, retain_records):
    """The model's utility set (issue 28): model utility on records no run trains on, on the new version beside the
    base, each figure the one the metric gives on those records alone; without one the section says why."""
    from lethe.engine.audit.measurements import EvaluationSet, retain_utility
    from lethe.engine.audit.metrics import harmonic_mean
    from lethe.engine.model.loading import context_length

    base, tokenizer = load_model(fixture_model, torch.device("cpu"))
    damaged, _ = load_model(fixture_model, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a version that lost some of what it knew
        for p in damaged.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    utility = retain_records[:6]
    inputs = RunInputs.of(forget_records, retain_records[6:])
    options = {"relearn": False, "quantization": False}
    report = run_audit(str(fixture_model), damaged, tokenizer, inputs, options=options, utility=utility)
    section = report["utility_set"]

    def direct(model):
        records = EvaluationSet(utility, tokenizer, context_length(base, tokenizer), 0, "utility")
        return retain_utility(model, tokenizer, records)

    assert section["value"] == pytest.approx(direct(damaged)["model_utility"]["value"])
    assert section["base_value"] == pytest.approx(direct(base)["model_utility"]["value"])
    assert section["value"] < section["base_value"] and section["change"] == pytest.approx(
        section["value"] - section["base_value"])
    parts = [c["value"] for c in section["components"].values()]
    assert section["value"] == pytest.approx(harmonic_mean(parts))
    assert run_audit(str(fixture_model), damaged, tokenizer, inputs, options=options)["utility_set"]["reason"] == \
        "no utility records registered for this model"
    # A record the model cannot be asked (its answer longer than the context) costs the figure, not the audit.
    too_long = [{"id": "long", "prompt": "Q:", "completion": " ".join(["word"] * 5000)}]
    report = run_audit(str(fixture_model), damaged, tokenizer, inputs, options=options, utility=too_long)
    assert report["utility_set"]["value"] is None and "utility record" in report["utility_set"]["reason"]
    assert report["after"]["forget_verbatim"]["exact_match"]["value"] is not None
