"""Whether another record's word said in an answer is tied to the answer's subject (issue 28): the gain on the current
model, checked against one forward pass per sequence, unpadded."""
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lethe.engine.methods.masc.subject_tie import TieQuestion, overlapping_tokens, single_word, subject_gains, tied


@pytest.mark.parametrize("span, single", [("fears", True), ("Fears.", True), ("Kuwait City", False),
                                          ("9280862", False), ("x7", False), ("well-known", False)])
def test_a_single_word_is_one_word_without_digits(span, single):
    assert single_word(span) is single


def test_overlapping_tokens_match_a_character_by_character_count():
    rng = random.Random(0)
    for _ in range(300):
        ends = sorted(rng.sample(range(1, 40), rng.randint(1, 10)))
        regions = [(s, s + rng.randint(1, 6)) for s in rng.sample(range(0, 40), rng.randint(0, 3))]
        chars = {c for s, e in regions for c in range(s, e)}
        brute = [k for k in range(len(ends)) if chars & set(range(ends[k - 1] if k else 0, ends[k]))]
        assert overlapping_tokens(ends, regions) == brute


@pytest.fixture(scope="module")
def model_and_tokenizer(fixture_model):
    return AutoModelForCausalLM.from_pretrained(fixture_model).eval(), AutoTokenizer.from_pretrained(fixture_model)


def test_a_words_gain_is_its_log_probability_about_the_subject_less_the_mean_about_others(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer

    def ids(text):
        return tokenizer(text)["input_ids"]

    prompt = ids("Question: Where was Nelvorbax born?\nAnswer: ")
    others = [ids("Question: Where was Quorvane born?\nAnswer: "), ids("Question: Where was Ann Lee born?\nAnswer: ")]
    answer = tokenizer(" in a small town by the sea", add_special_tokens=False)["input_ids"]
    words = [[1, 2], [len(answer) - 1]]

    def brute(p, k):  # log p of answer token k after p and the answer before it, one unpadded sequence
        with torch.no_grad():
            logits = model(torch.tensor([p + answer])).logits[0]
        return torch.log_softmax(logits[len(p) + k - 1].float(), -1)[answer[k]].item()

    expected = [sum(brute(prompt, k) for k in w) - sum(brute(o, k) for o in others for k in w) / len(others)
                for w in words]
    got = subject_gains(model, tokenizer.pad_token_id, [TieQuestion(prompt, others, answer, words)])[0]
    assert got == pytest.approx(expected, abs=1e-4)
    # Tied where a word reaches min_gain; a question that cannot show a word untied counts as tied.
    question = TieQuestion(prompt, others, answer, words)
    assert tied(model, tokenizer.pad_token_id, [question], max(expected) - 1e-3) == [True]
    assert tied(model, tokenizer.pad_token_id, [question], max(expected) + 1e-3) == [False]
    assert tied(model, tokenizer.pad_token_id, [TieQuestion(prompt, [], answer, words), question], 1e9) == [True, False]
    assert tied(model, tokenizer.pad_token_id, [TieQuestion(prompt, others, answer, [[1], []])], 1e9) == [True]
