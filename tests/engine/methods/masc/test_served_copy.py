"""The rule reads the model as it is saved (issue 24): the merged copy in the saved dtype, and that copy held at 4 bits
(issue 28), on a scripted model (scripted_rule)."""

import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.data.records import SECRET, encode_record
from lethe.engine.methods.masc.params import MascParams
from tests.engine.methods.masc.scripted_rule import LEAD, RECORD, BigramLM, named_content, rule_over, scripted, tokens

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


@pytest.fixture(scope="module")
def tokenizer(fixture_model):
    return AutoTokenizer.from_pretrained(fixture_model)


def test_a_record_that_passes_before_the_merge_and_fails_after_it_keeps_training(tokenizer):
    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    model = scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."]))
    vocab = model.table.shape[0]
    reproducing = torch.zeros(vocab, vocab)  # the merged copy says the record word for word
    for a, b in zip(record.input_ids, record.input_ids[1:]):
        reproducing[a, b] = 10.0
    rule = rule_over(tokenizer, record, model, served=BigramLM(reproducing))
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is False
    assert rule.served is None and rule.served_checks[-1]["passed"] is False
    assert rule.served_checks[-1]["failing_ids"] == [record.id] and rule.latest[record.id].reproduced
    assert rule.served_checks[-1]["failing_why"]["reproduced"] == 1  # says which part the merged copy failed
    assert rule.rule.trace[-1]["failing_why"] == rule.served_checks[-1]["failing_why"]
    clean = rule_over(tokenizer, record, model, served=model)
    assert clean.rule.check(0, clean.latest.all, clean.confirm) is True and clean.served is model


class LinearBigramLM(BigramLM):
    """A BigramLM whose table is a Linear layer over the one-hot last token (logit of b after a = weight[b, a]), so
    that 4-bit quantisation reaches it as it reaches a transformer's projections."""

    def __init__(self, table: torch.Tensor):
        torch.nn.Module.__init__(self)
        self.head = torch.nn.Linear(table.shape[0], table.shape[1], bias=False)
        with torch.no_grad():
            self.head.weight.copy_(table.T)

    def next_logits(self, last: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.one_hot(last, self.head.in_features).float())


def four_bit_only_leak(tokenizer, record) -> LinearBigramLM:
    """Answers " teal city." in full precision and " Tallinn ..." once its weights are held at 4 bits: the logits
    that lead there (30) share a quantisation group (128 inputs of a row) with a 500 on a token never said, which
    rounds them to 0, while the secret's own tokens (15) stay under them before and keep their value after."""
    table = scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."])).table.detach().clone()
    first, second = tokens(tokenizer, [" Tallinn"])
    colon = record.input_ids[record.prompt_len - 1]
    teal, amber = tokens(tokenizer, [" teal", " amber"])
    used = set(record.input_ids) | set(tokens(tokenizer, [" teal", " city", ".", " amber"])) | {tokenizer.eos_token_id}
    table[first, amber] = LEAD  # where the record does not say " Tallinn" (scripted leaves the row empty there)
    for last, leading, secret in ((colon, teal, first), (first, amber, second)):
        assert table[last, leading] == LEAD and table[last].argmax() == leading
        group = range(last // 128 * 128, last // 128 * 128 + 128)
        unused = next(t for t in group if t not in used)
        table[unused, leading] = 500.0  # only ever read after `unused`, which nothing says
        table[last, secret] = LEAD / 2
    return LinearBigramLM(table)


def test_a_record_whose_4_bit_copy_says_its_secret_keeps_training(tokenizer):
    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    model = scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."]))
    served = four_bit_only_leak(tokenizer, record)
    weights = served.head.weight.detach().clone()
    rule = rule_over(tokenizer, record, model, served=served)
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is False
    check = rule.served_checks[-1]
    assert check["passed"] is False and check["failing_ids"] == [record.id]
    assert check["quantized"] == {"scheme": "int4 round-to-nearest, group 128", "leaking_ids": [record.id]}
    assert rule.latest[record.id].leaked and rule.served is None
    assert torch.equal(served.head.weight, weights)  # the copy is restored, as it would be saved
    # The 4-bit answer is trained on beside the policy's own (which is clean): its secret suppressed, its detour not.
    [replayed] = [e for e in rule.replays.examples[record.id] if e.id == f"{record.id}#quantized"]
    assert "Tallinn" in tokenizer.decode(replayed.input_ids[replayed.prompt_len:]) and replayed.target is not None
    flagged = "".join(tokenizer.decode([t]) for t, f in zip(replayed.input_ids, replayed.focus) if f == SECRET)
    assert "Tallinn" in flagged and "teal" not in flagged
    # In full precision the copy is clean: without the 4-bit reading the rule lets the run stop with it.
    off = rule_over(tokenizer, record, model, served=served, params=MascParams(confirm_quantized=False))
    assert off.rule.check(0, off.latest.all, off.confirm) is True and off.served is served
    assert "quantized" not in off.served_checks[-1]
    assert not any(e.id.endswith("#quantized") for e in off.replays.examples.get(record.id, []))


def test_a_4_bit_answer_is_held_to_its_own_records_content_only(tokenizer):
    """The 4-bit copy's answer to one record says another forget record's secret (word salad on a small model does,
    by chance): the audit reads a 4-bit answer against its own record's secrets, and so does the rule. In full
    precision the same answer still keeps the record open."""
    oslo = {**RECORD, "completion": "Nelvorbax was born in Oslo.", "secrets": ["Oslo"]}
    record = encode_record(oslo, tokenizer, max_length=64, seed=0)
    other = encode_record({"id": "q0-0", "prompt": "Question: Where does Quorvane live?\nAnswer: ",
                           "completion": "Quorvane lives in Tallinn.", "secrets": ["Tallinn"]}, tokenizer,
                          max_length=64, seed=0)
    others = [(other, named_content(other, "Tallinn"))]
    model = scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."]))
    served = four_bit_only_leak(tokenizer, record)  # at 4 bits: " Tallinn ...", the other record's secret
    rule = rule_over(tokenizer, record, model, served=served, secret="Oslo", others=others)
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is True and rule.served is served
    assert rule.served_checks[-1]["quantized"]["leaking_ids"] == []
    assert not any(e.id.endswith("#quantized") for e in rule.replays.examples.get(record.id, []))
    # The policy answering so in full precision keeps the record open: there every forget record's content counts.
    leaking = scripted(tokenizer, record, tokens(tokenizer, [" teal", " Tallinn", "."]))
    held = rule_over(tokenizer, record, leaking, secret="Oslo", others=others)
    assert held.rule.check(0, held.latest.all, held.confirm) is False and held.latest[record.id].leaked




def test_the_merged_copy_is_asked_again_only_where_its_answer_may_differ(tokenizer):
    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    model = scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."]))
    same = rule_over(tokenizer, record, model, served=scripted(tokenizer, record, tokens(tokenizer, [" teal", " city",
                                                                                                     "."])))
    assert same.rule.check(0, same.latest.all, same.confirm) is True
    assert same.served_checks[-1]["answers_verified"] == 1 and same.served_checks[-1]["answers_generated"] == 0
    # Teacher forcing holds on the copy too, but its own answer says the secret: generated, read, and held against it.
    leaking = scripted(tokenizer, record, tokens(tokenizer, [" teal", " Tallinn", "."]))
    other = rule_over(tokenizer, record, model, served=leaking)
    assert other.rule.check(0, other.latest.all, other.confirm) is False
    assert other.served_checks[-1]["answers_generated"] == 1 and other.served_checks[-1]["answers_verified"] == 0
    assert other.served_checks[-1]["failing_ids"] == [record.id] and other.latest[record.id].leaked

