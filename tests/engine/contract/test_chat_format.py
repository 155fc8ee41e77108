"""Chat models (issue 14): records rendered with the tokenizer's chat template (a user turn, the assistant's answer
scored), refused where there is no template, and unlearned in that format end to end."""
import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.contract.chat_format import RENDERED, checkpoint_has_chat_template, render
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import IGNORE, encode_record
from lethe.engine.methods import params_for
from lethe.engine.model.loading import load_model
from lethe.engine.unlearn import run_unlearning
from tests.conftest import CHAT_TEMPLATE

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

RECORD = {"id": "c1", "prompt": "Where was Kalo born?", "completion": "Kalo was born in Riga.",
          "paraphrased_prompt": "What is Kalo's birthplace?", "paraphrased_completion": "In Riga.",
          "perturbed_completions": ["Kalo was born in Oslo."], "secrets": ["Riga"]}


@pytest.fixture(scope="module")
def chat_tokenizer(chat_fixture_model):
    return AutoTokenizer.from_pretrained(chat_fixture_model)


def test_a_record_is_rendered_as_a_user_turn_and_the_assistant_answer_is_what_is_scored(chat_tokenizer):
    [rendered] = render(normalise_records([RECORD], "forget"), chat_tokenizer, "chat", "forget")
    eos = chat_tokenizer.eos_token
    assert rendered["prompt"] == "User: Where was Kalo born?\nAssistant:"
    assert rendered["completion"] == f" Kalo was born in Riga.{eos}" and rendered[RENDERED] is True
    assert rendered["paraphrased_prompt"] == "User: What is Kalo's birthplace?\nAssistant:"
    assert rendered["paraphrased_completion"] == f" In Riga.{eos}"
    assert rendered["perturbed_completions"] == [f" Kalo was born in Oslo.{eos}"]
    assert "Riga" in rendered["completion"] and rendered["secrets"] == ["Riga"]  # secrets stay spans of the answer
    encoded = encode_record(rendered, chat_tokenizer, max_length=512, seed=0)
    whole = chat_tokenizer.apply_chat_template([{"role": "user", "content": RECORD["prompt"]},
                                                {"role": "assistant", "content": RECORD["completion"]}],
                                               tokenize=False)
    # The conversation as the template writes it, up to the EOS that ends the answer (generation stops there: what
    # the template adds after it, here a newline, could never be reproduced).
    assert whole.endswith(f"{eos}\n") and chat_tokenizer.decode(encoded.input_ids) == whole[:-1]
    active = [t for t in encoded.labels if t != IGNORE]
    assert chat_tokenizer.decode(active) == rendered["completion"]  # the assistant's turn, its end marker included
    assert active.count(chat_tokenizer.eos_token_id) == 1  # the template's, no second EOS appended
    assert encoded.labels[:encoded.prompt_len] == [IGNORE] * encoded.prompt_len


def test_plain_records_are_left_as_they_are(chat_tokenizer):
    records = normalise_records([RECORD, {"id": "t", "text": "a passage"}], "forget")
    assert render(records, chat_tokenizer, "plain", "forget") is records


@pytest.mark.parametrize("records,template,field,words", [
    ([RECORD], None, "format", "no chat template"),
    ([{"id": "t", "text": "a passage to forget"}], CHAT_TEMPLATE, "forget", "needs prompt and completion"),
    ([RECORD], "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}",
     "format", "does not write the answer after the prompt"),
])
def test_the_chat_format_is_refused_where_it_cannot_be_rendered(fixture_model, records, template, field, words):
    tokenizer = AutoTokenizer.from_pretrained(fixture_model)
    tokenizer.chat_template = template
    with pytest.raises(EngineInputError, match=words) as caught:
        render(normalise_records(records, "forget"), tokenizer, "chat", "forget")
    assert caught.value.field == field
    with pytest.raises(EngineInputError, match="plain"):
        render(records, tokenizer, "markdown", "forget")


def test_a_checkpoint_says_whether_it_has_a_template(fixture_model, chat_fixture_model):
    assert checkpoint_has_chat_template(chat_fixture_model) and not checkpoint_has_chat_template(fixture_model)


def test_a_chat_model_is_unlearned_in_its_chat_format(chat_fixture_model, forget_records, retain_records):
    outcome = run_unlearning(str(chat_fixture_model), forget_records[:4], retain_records[:8], format="chat",
                             params=params_for("masc", {"max_steps": 3, "lr": 1e-3}))
    r = outcome.result
    assert r.format == "chat" and r.steps == 3 and r.as_dict()["format"] == "chat"
    assert [p["id"] for p in r.measured.per_record] == [rec["id"] for rec in forget_records[:4]]
    # What was measured is the assistant's answer: as many active tokens as the rendered answer has.
    _, tokenizer = load_model(chat_fixture_model, torch.device("cpu"))
    [first] = render(normalise_records(forget_records[:1], "forget"), tokenizer, "chat", "forget")
    answer_tokens = len(tokenizer(first["completion"], add_special_tokens=False)["input_ids"])
    assert r.measured.per_record[0]["active_tokens"] == answer_tokens
