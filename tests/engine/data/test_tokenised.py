"""Tokenised once (issue 27): a request's records are encoded once per tokenizer and context, and every reader
gets its own copies. Tokenizers trained here in milliseconds (lethe.engine.model.fixture.train_tokenizer)."""
import pytest

from lethe.engine.data.inputs import RunInputs
from lethe.engine.data.records import SECRET, encode_records
from lethe.engine.data.tokenised import tokenizer_fingerprint
from lethe.engine.model.fixture import train_tokenizer


@pytest.fixture(scope="module")
def tokenizers(people):
    records = [r for p in people for r in p]
    return {"digits": train_tokenizer(records, 300, "digits"), "gpt2": train_tokenizer(records, 300, "gpt2"),
            "digits_small": train_tokenizer(records, 280, "digits")}


def test_a_tokenizer_saved_and_reloaded_is_the_same_tokenizer(tokenizers, tmp_path):
    from transformers import AutoTokenizer

    for name, tokenizer in tokenizers.items():
        tokenizer.save_pretrained(tmp_path / name)
        reloaded = AutoTokenizer.from_pretrained(tmp_path / name)
        assert tokenizer_fingerprint(reloaded) == tokenizer_fingerprint(tokenizer)
    prints = {tokenizer_fingerprint(t) for t in tokenizers.values()}
    assert len(prints) == 3  # another pre-tokenisation, another vocabulary: another tokenizer
    chat = AutoTokenizer.from_pretrained(tmp_path / "digits")
    chat.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tokenizer_fingerprint(chat) != tokenizer_fingerprint(tokenizers["digits"])  # renders records otherwise


def test_a_slow_tokenizer_has_no_fingerprint_and_is_encoded_afresh(tokenizers, forget_records):
    class Slow:  # what a tokenizer without a backend serialisation looks like to the cache
        def __init__(self, fast):
            self.fast = fast
            self.eos_token_id, self.chat_template = fast.eos_token_id, None

        def __call__(self, *a, **kw):
            return self.fast(*a, **kw)

    slow = Slow(tokenizers["digits"])
    assert tokenizer_fingerprint(slow) is None
    inputs = RunInputs.of(forget_records)
    assert inputs.tokenised(slow, 0, 0) is not inputs.tokenised(slow, 0, 0)
    assert inputs.tokenised(slow, 0, 0).encoded == inputs.tokenised(slow, 0, 0).encoded


def test_encodings_are_computed_once_per_tokenizer_context_and_seed(tokenizers, forget_records, retain_records):
    inputs = RunInputs.of(forget_records, retain_records, retain_records[:2])
    digits = inputs.tokenised(tokenizers["digits"], 0, 0)
    assert inputs.tokenised(tokenizers["digits"], 0, 0) is digits
    for other in (inputs.tokenised(tokenizers["gpt2"], 0, 0), inputs.tokenised(tokenizers["digits"], 64, 0),
                  inputs.tokenised(tokenizers["digits"], 0, 1)):
        assert other is not digits
    # What is cached is what encoding the records afresh gives.
    for what, records in (("forget", inputs.forget), ("retain", inputs.retain), ("holdout", inputs.holdout)):
        assert digits.records(what) == encode_records(records, tokenizers["digits"], max_length=0, seed=0, what=what)
    assert [r.input_ids for r in digits.records("forget")] != \
        [r.input_ids for r in inputs.tokenised(tokenizers["gpt2"], 0, 0).records("forget")]
    assert RunInputs.of(forget_records) == RunInputs.of(forget_records)  # the cache is not part of the value


def test_every_reader_gets_copies_it_may_change(tokenizers, forget_records):
    inputs = RunInputs.of(forget_records)
    first = inputs.tokenised(tokenizers["digits"], 0, 0).records("forget")
    pristine = [(r.input_ids.copy(), r.labels.copy()) for r in first]
    for record in first:  # as MASC does to the records it trains on
        record.focus = [SECRET] * len(record.input_ids)
        record.input_ids.append(0)
        record.labels[0] = 7
    again = inputs.tokenised(tokenizers["digits"], 0, 0).records("forget")
    assert [(r.input_ids, r.labels) for r in again] == pristine
    assert all(r.focus is None and r.target is None for r in again)
