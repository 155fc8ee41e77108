"""Records and parameters: encoding (EOS, active tokens, continuation split, truncation) and bad input."""

import pytest
import torch

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records, read_records
from lethe.engine.data.records import IGNORE, SPLIT_MIN_SIDE, collate, encode_record
from lethe.engine.methods.masc.params import PRESETS, MascParams
from lethe.engine.model.loading import load_model


@pytest.fixture(scope="module")
def tokenizer(fixture_model):
    return load_model(fixture_model, torch.device("cpu"))[1]


def test_prompt_completion_is_one_string_with_eos_and_only_completion_active(tokenizer):
    record = normalise_records([{"id": "a", "prompt": "Question: Who?\nAnswer: ", "completion": "Kalo is."}],
                               "forget")[0]
    enc = encode_record(record, tokenizer, max_length=512, seed=0)
    assert tokenizer.decode(enc.input_ids) == "Question: Who?\nAnswer: Kalo is." + tokenizer.eos_token
    active = [t for t in enc.labels if t != IGNORE]
    assert active[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(active[:-1]) == "Kalo is."
    assert enc.labels[:enc.prompt_len] == [IGNORE] * enc.prompt_len


def test_continuation_split_is_seeded_and_keeps_32_tokens_each_side(tokenizer):
    long_text = " ".join(f"word{i}" for i in range(200))
    record = normalise_records([{"id": "t1", "text": long_text}], "forget")[0]
    a = encode_record(record, tokenizer, max_length=4096, seed=3)
    b = encode_record(record, tokenizer, max_length=4096, seed=3)
    n = len(a.input_ids)
    assert a.labels == b.labels  # deterministic under the seed
    assert SPLIT_MIN_SIDE <= a.prompt_len <= n - SPLIT_MIN_SIDE
    assert 0.2 * n - 1 <= a.prompt_len <= 0.6 * n + 1
    prefixes = {encode_record(record, tokenizer, max_length=4096, seed=s).prompt_len for s in range(8)}
    assert len(prefixes) > 1  # and it does depend on the seed
    short = encode_record(normalise_records([{"id": "t2", "text": "short text here"}], "f")[0], tokenizer,
                          max_length=512, seed=0)
    assert short.prompt_len == 1 and short.labels[0] == IGNORE and all(t != IGNORE for t in short.labels[1:])


def test_long_prompt_is_truncated_from_the_left_and_long_completion_refused(tokenizer):
    record = normalise_records([{"id": "x", "prompt": "blah " * 100, "completion": "Kalo is."}], "forget")[0]
    full = encode_record(record, tokenizer, max_length=4096, seed=0)
    cut = encode_record(record, tokenizer, max_length=40, seed=0)
    assert len(cut.input_ids) == 40 and cut.truncated_tokens == len(full.input_ids) - 40
    assert cut.input_ids == full.input_ids[-40:]  # the left of the prompt went, the completion stayed
    long_answer = normalise_records([{"id": "y", "prompt": "Q", "completion": "word " * 100}], "forget")[0]
    with pytest.raises(EngineInputError, match="'y'.*exceed the model's context"):
        encode_record(long_answer, tokenizer, max_length=40, seed=0)


def test_collate_masks_padding(tokenizer):
    records = normalise_records([{"prompt": "Q ", "completion": "a"}, {"prompt": "Q ", "completion": "a b c d e"}], "f")
    batch = collate([encode_record(r, tokenizer, max_length=512, seed=0) for r in records], tokenizer.pad_token_id)
    short = batch.attention_mask[0].sum().item()
    assert (batch.labels[0, short:] == IGNORE).all() and (batch.attention_mask[0, short:] == 0).all()


@pytest.mark.parametrize("records,message", [
    ([], "forget set is empty"),
    ([{"id": "r1", "foo": "bar"}], r"record 0 \(id 'r1'\): needs prompt and completion, or text"),
    ([{"prompt": "Q", "completion": ""}], "empty completion"),
    ([{"prompt": "Q"}], "prompt and completion must both be strings"),
    ([{"text": "   "}], "text must be a non-empty string"),
    ([{"text": "a", "prompt": "b", "completion": "c"}], "both text and prompt/completion"),
    ([{"id": 1, "text": "a"}, {"id": 1, "text": "b"}], "duplicate id"),
    (["just a string"], "expected an object"),
    # The engine's own marks (a window's token ids, a chat rendering) are not a request's to set.
    ([{"id": "r", "text": "a b", "_tokens": [1, 2]}], "'_tokens' is not a record field"),
    ([{"id": "r", "prompt": "Q", "completion": "A", "_chat": True}], "'_chat' is not a record field"),
    ([{"id": "r", "prompt": "Q", "completion": "A", "request": 7}], "request must be a non-empty string"),
])
def test_bad_records_are_refused_by_name(records, message):
    with pytest.raises(EngineInputError, match=message):
        normalise_records(records, "forget")


def test_tofu_rows_map_to_prompt_and_completion():
    row = {"id": 7, "question": "Q?", "answer": "A.", "paraphrased_question": "PQ?",
           "perturbed_answers": ["B.", "C."]}
    record = normalise_records([row], "forget")[0]
    assert (record["prompt"], record["completion"], record["paraphrased_prompt"], record["id"]) == \
        ("Q?", "A.", "PQ?", "7")
    assert record["perturbed_completions"] == ["B.", "C."]


def test_read_records_json_and_jsonl(tmp_path):
    (tmp_path / "a.json").write_text('[{"text": "x"}]')
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\n\n{"text": "y"}\n')
    (tmp_path / "c.jsonl").write_text('{"text": "x"}\n{oops\n')
    assert len(read_records(tmp_path / "a.json")) == 1
    assert len(read_records(tmp_path / "b.jsonl")) == 2
    with pytest.raises(EngineInputError, match="line 2 is not JSON"):
        read_records(tmp_path / "c.jsonl")
    with pytest.raises(EngineInputError, match="no such file"):
        read_records(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("values,preset,message", [
    ({"alpha": 0.0}, None, "alpha"), ({"alpha": 1}, None, "alpha"), ({"rho": 1.0}, None, "rho"),
    ({"rho": -0.1}, None, "rho"), ({"k": 0}, None, "k"), ({"k": 2.5}, None, "k"),
    ({"gamma": 1}, None, "unknown parameter 'gamma'"),
    ({"alternatives": "oracle"}, None, "alternatives"), ({"eta": 0}, None, "eta"), ({"alpha": "high"}, None, "alpha"),
    ({}, "llama-9000", "unknown preset 'llama-9000'"), ({"max_steps": 0}, None, "max_steps"),
    ({"alpha": "automatic"}, None, "alpha"), ({"record_ceiling": 0}, None, "record_ceiling"),
    ({"record_ceiling": 1.5}, None, "record_ceiling"), ({"lora_targets": []}, None, "lora_targets"),
    ({"lora_targets": ["auto", "q_proj"]}, None, "lora_targets"), ({"neighbour_share": 1.5}, None, "neighbour_share"),
    ({"val_mode": "all"}, None, "val_mode"),
    ({"lambda_forget_max": 0}, None, "lambda_forget_max"),
    ({"suppress": "sometimes"}, None, "suppress"),
    ({"secret_focus": True}, None, "unknown parameter 'secret_focus'"),  # replaced by suppress (issue 24)
    ({"lr": 1e308}, None, "lr"),  # accepted with 202 before issue 12, and would have run
    ({"max_steps": 1e308}, None, "max_steps"),
    ({"max_steps": 10 ** 7}, None, "max_steps"),
    ({"batch_size": 10 ** 6}, None, "batch_size"),
    ({"seed": 2 ** 33}, None, "seed"),
    ({"k": 10 ** 5}, None, "k"),
    ({"lambda_retain": "often"}, None, "lambda_retain"),
    ({"lambda_target": -1}, None, "lambda_target"),
    ({"greedy_margin": -0.5}, None, "greedy_margin"),
])
def test_bad_parameters_are_refused_by_name(values, preset, message):
    with pytest.raises(EngineInputError, match=message):
        MascParams.from_dict(values, preset=preset)


def test_presets_carry_the_published_defaults_and_explicit_values_win():
    tofu = MascParams.from_dict({}, preset="tofu-llama2")
    assert (tofu.lambda_forget, tofu.rho, tofu.eta, tofu.k, tofu.alpha, tofu.lr, tofu.batch_size) == \
        (0.05, 0.7, 0.25, 10, 0.475, 1e-4, 2)
    assert (tofu.retain_loss, tofu.lambda_retain) == ("nll", 0.0)  # the official TOFU run
    muse = MascParams.from_dict({"alpha": 0.5}, preset="muse-news")
    assert (muse.alternatives, muse.k, muse.delta, muse.beta, muse.rho, muse.alpha) == \
        ("teacher", 2, 0.5, 5.0, 0.7, 0.5)
    scaling = MascParams.from_dict({}, preset="qwen2.5-scaling")
    assert (scaling.lambda_forget, scaling.rho, scaling.eta, scaling.k, scaling.beta, scaling.alpha) == \
        (0.1, 0.5, 0.5, 10, 1.0, 0.2)
    # Our defaults: the published margin, a calibrated target and a gentler forget weight.
    defaults = MascParams()
    assert (defaults.alpha, defaults.record_ceiling, defaults.lora_targets, defaults.val_mode) == \
        ("auto", "auto", "auto", "train")
    assert (defaults.rho, defaults.eta, defaults.k, defaults.beta) == \
        (scaling.rho, scaling.eta, scaling.k, scaling.beta)
    assert set(PRESETS) == {"qwen2.5-scaling", "tofu-llama2", "muse-news", "whole-record", "gentle", "fast"}
    # The escalation (issue 28): the defaults cap it at 0.1, aim at 1,000 steps and leave room to 2,000; "gentle"
    # aims at 2,000; "fast" is the defaults before (up to 1 within 1,000 steps).
    gentle, fast = MascParams.from_dict({}, preset="gentle"), MascParams.from_dict({}, preset="fast")
    assert (defaults.lambda_forget_max, defaults.pace_steps, defaults.max_steps) == (0.1, 1000, 2000)
    assert (gentle.lambda_forget_max, gentle.pace_steps, gentle.max_steps) == (0.1, 2000, 2000)
    assert (fast.lambda_forget_max, fast.pace_steps, fast.max_steps, fast.suppress, fast.lambda_forget) == \
        (1.0, 1000, 1000, "content", defaults.lambda_forget)
    # One default for named secrets and plain records alike: content suppression with destinations (issue 24);
    # "whole-record" is the paper's suppression of every token with our per-record rule.
    assert (defaults.suppress, defaults.lambda_retain, defaults.lambda_keep, defaults.greedy_margin) == \
        ("content", "auto", "auto", 1.0)
    assert (defaults.resolved().lambda_retain, defaults.resolved().lambda_keep) == (3.0, 3.0)
    with pytest.raises(ValueError, match="lambda_keep is still 'auto'"):  # only resolved parameters train
        _ = defaults.keep_weight
    whole = MascParams.from_dict({}, preset="whole-record")
    assert (whole.suppress, whole.resolved().lambda_retain, whole.resolved().keep_weight, whole.greedy_margin) == \
        ("whole", 1.0, 0.0, 0.0)
    # Explicit values win over "auto".
    assert MascParams.from_dict({"lambda_retain": 2}).resolved().lambda_retain == 2.0
    assert MascParams.from_dict({"suppress": "whole"}).resolved().lambda_retain == 1.0
    # The published presets suppress whole records, and "auto" keeps no gaps with a cross-entropy retain term.
    assert all(MascParams.from_dict({}, preset=p).suppress == "whole"
               for p in ("qwen2.5-scaling", "tofu-llama2", "muse-news"))
    assert MascParams.from_dict({"retain_loss": "nll"}).resolved().keep_weight == 0.0
    assert MascParams.from_dict({"lambda_keep": 0.5}).resolved().keep_weight == 0.5
    with pytest.raises(EngineInputError, match="lambda_keep"):  # no term that silently does nothing
        MascParams.from_dict({"lambda_keep": 1.0, "retain_loss": "nll"})
    # The whole-logit term (issue 28) follows lambda_keep: 8 with content and the KL, off as published or with NLL.
    assert defaults.lambda_logits == "auto" and defaults.resolved().logits_weight == 8.0
    assert whole.resolved().logits_weight == 0.0
    assert all(MascParams.from_dict({}, preset=p).resolved().logits_weight == 0.0
               for p in ("qwen2.5-scaling", "tofu-llama2", "muse-news"))
    assert MascParams.from_dict({"retain_loss": "nll"}).resolved().logits_weight == 0.0
    assert MascParams.from_dict({"lambda_logits": 2}).resolved().logits_weight == 2.0
    with pytest.raises(EngineInputError, match="lambda_logits"):
        MascParams.from_dict({"lambda_logits": 1.0, "retain_loss": "nll"})
    assert MascParams.from_dict({"seed": 2 ** 31 - 1}).seed == 2 ** 31 - 1  # a common seed stays allowed
    # Hoeffding's bound only over held-out records: in train mode D_val is the trained records (issue 25).
    with pytest.raises(EngineInputError, match="hoeffding.*val_mode"):
        MascParams.from_dict({"hoeffding": True})
    cli_style = MascParams.from_dict({"k": "3", "hoeffding": "true", "lora_targets": "q_proj,v_proj", "alpha": "0.3",
                                      "val_mode": "holdout"})
    assert (cli_style.k, cli_style.hoeffding, cli_style.lora_targets, cli_style.alpha) == \
        (3, True, ["q_proj", "v_proj"], 0.3)
    assert MascParams.from_dict({"alpha": "auto", "lora_targets": "auto"}).alpha == "auto"
