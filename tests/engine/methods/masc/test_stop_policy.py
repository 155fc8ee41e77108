"""The stop rule reads the model's answers and the model as it is saved (issue 24), on a scripted model: a bigram table
whose greedy path from a prompt is written by hand, so that every teacher-forced condition holds while the answer
loops, leaks, or the merged copy reproduces the record."""
import math
import types

import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.data.records import SECRET, TEMPLATE, encode_record
from lethe.engine.methods.masc.answers import Answering
from lethe.engine.methods.masc.content import Atom, substitution
from lethe.engine.methods.masc.destination import Content
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.replay import Replays
from lethe.engine.methods.masc.stop_policy import MascStopPolicy
from lethe.engine.methods.masc.stop_rule import ErasureCondition, OnlineStopRule, RecordCheck, RecordStates

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

RECORD = {"id": "p0-0", "prompt": "Question: Where was Nelvorbax born?\nAnswer: ",
          "completion": "Nelvorbax was born in Tallinn.", "secrets": ["Tallinn"]}


class BigramLM(torch.nn.Module):
    """Next-token logits that depend on the last token only; `generate` decodes greedily as transformers does."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)

    def next_logits(self, last: torch.Tensor) -> torch.Tensor:
        return self.table[last]

    def forward(self, input_ids, attention_mask=None, use_cache=False, **_):
        return types.SimpleNamespace(logits=self.next_logits(input_ids))

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, eos_token_id=None, do_sample=False,
                 num_return_sequences=1, **_):
        ids = input_ids.repeat_interleave(num_return_sequences, dim=0)
        for _ in range(max_new_tokens):
            logits = self.next_logits(ids[:, -1])
            chosen = torch.multinomial(logits.softmax(-1), 1) if do_sample else logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, chosen], dim=1)
        return ids


@pytest.fixture(scope="module")
def tokenizer(fixture_model):
    return AutoTokenizer.from_pretrained(fixture_model)


LEAD = 30.0  # a scripted successor's logit: every other token together keeps under 1e-9 of a sample


def scripted(tokenizer, record, answer: list[int]) -> BigramLM:
    """A model under which no token of the record is the argmax given the one before it (every teacher-forced
    condition holds), and whose greedy answer to the prompt is `answer` (and, but for 1e-9, every sample)."""
    vocab = len(tokenizer)
    table = torch.zeros(vocab, vocab)
    ids = record.input_ids
    elsewhere = tokenizer(" amber", add_special_tokens=False)["input_ids"][0]
    for a in ids[:-1]:
        table[a, elsewhere] = LEAD  # after every token of the record, something else leads
    path = [ids[record.prompt_len - 1], *answer, tokenizer.eos_token_id]
    written = set()
    for a, b in zip(path, path[1:]):
        if a not in written:  # a token's first successor on the path is its successor: a path can close a loop
            written.add(a)
            table[a] = 0
            table[a, b] = LEAD
    table[tokenizer.eos_token_id, tokenizer.eos_token_id] = LEAD
    return BigramLM(table)


def tokens(tokenizer, words: list[str]) -> list[int]:
    return [t for w in words for t in tokenizer(w, add_special_tokens=False)["input_ids"]]


def rule_over(tokenizer, record, model: BigramLM, served: BigramLM | None = None,
              params: MascParams | None = None, secret: str = "Tallinn",
              others: list | None = None, substitutions: list | None = None) -> MascStopPolicy:
    """The rule's own confirm and with_answers, around a scripted policy (no training happens); `others`: more forget
    records, (record, Content) pairs, whose content answers are held to, outside the records the rule checks."""
    said = record.source["completion"]
    start = said.index(secret)
    content = Content([Atom(start, start + len(secret), secret)], [secret], {}, [], named=True,
                      substitutions=substitutions or [])
    record.focus = [TEMPLATE] * len(record.input_ids)
    for k in range(record.prompt_len, len(record.input_ids)):
        piece = tokenizer.decode([record.input_ids[k]]).strip()
        if piece and piece in secret:
            record.focus[k] = SECRET
    trainable = types.SimpleNamespace(model=model, sharded=False, logits=lambda b: model(b.input_ids).logits,
                                   reference_logits=lambda b: model(b.input_ids).logits,
                                   merged_copy=lambda dtype: served or model)
    masc = Masc((params or MascParams()).resolved(), trainable, tokenizer.pad_token_id)
    masc.eos_id = tokenizer.eos_token_id
    rule = MascStopPolicy.__new__(MascStopPolicy)
    rule.params, rule.objective, rule.trainable = masc.params, masc, trainable
    rule.train_mode, rule.by_record, rule.confirm_set = True, {record.id: record}, [record]
    others = others or {}
    answering = Answering([record, *(r for r, _ in others)], {record.id: content, **{r.id: c for r, c in others}},
                          tokenizer, 64)
    rule.replays = Replays(answering, trainable.reference_logits, torch.device("cpu"), 0)
    rule.replays.base_loops = set()  # theta_0's own answers (start() asks them first) did not loop
    rule.erasure = ErasureCondition({record.id: 1.0}, 0.01, frozenset({record.id}))
    rule.rule = OnlineStopRule(0.5, 1, condition=rule.erasure)
    rule.run = types.SimpleNamespace(saved_dtype=torch.float32)
    rule.served, rule.served_checks, rule.sample_checks, rule.answered_at = None, [], [], {}
    rule.latest = RecordStates([RecordCheck(record.id, 0.0, 5, False)])
    return rule


@pytest.mark.parametrize("answer, stops, flag", [
    ([" teal", " amber", " teal", " amber", " teal", " amber", " teal"], False, "looped"),  # a loop
    ([" teal", " Tallinn", "."], False, "leaked"),  # the content, after a detour
    ([" teal", " city", "."], True, None),  # fluent and wrong
])
def test_a_model_whose_answer_loops_or_leaks_keeps_training(tokenizer, answer, stops, flag):
    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    model = scripted(tokenizer, record, tokens(tokenizer, answer))
    rule = rule_over(tokenizer, record, model)
    taught = rule.measure([record])[0]
    assert rule.erasure.holds(taught)  # teacher forcing finds nothing: only the answer can tell
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is stops
    last = rule.rule.last_confirmed[0]
    assert (last.looped, last.leaked) == (flag == "looped", flag == "leaked")
    assert rule.latest[record.id] == last  # the record stays open for training


CODE = {"id": "p0-1", "prompt": "Question: What is the code of Nelvorbax?\nAnswer: ",
        "completion": "The code of Nelvorbax is 48213.", "secrets": ["48213"]}


def sampling(tokenizer, source: dict, said: str) -> tuple:
    """A record and a model whose greedy answer is " teal city." and one of whose samples in three or so says
    " amber" and then `said` instead (issue 28: "+35 726 9280862", a number's tail behind a wrong first digit: here
    "948213" for "48213", whose digits after the first the model still says in a row)."""
    record = encode_record(source, tokenizer, max_length=64, seed=0)
    model = scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."]))
    detour = tokens(tokenizer, [" amber", said])
    model.table[record.input_ids[record.prompt_len - 1], detour[0]] = LEAD - 0.5
    for a, b in zip(detour, [*detour[1:], tokens(tokenizer, ["."])[0]]):
        model.table[a] = 0
        model.table[a, b] = LEAD
    return record, model


def test_a_record_whose_samples_give_its_number_back_keeps_training_and_that_sample_is_replayed(tokenizer):
    record, model = sampling(tokenizer, CODE, "948213")
    rule = rule_over(tokenizer, record, model, secret="48213")
    assert rule.erasure.holds(rule.measure([record])[0])  # teacher forcing and the greedy answer find nothing
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is False
    assert rule.rule.last_confirmed[0].leaked and rule.latest[record.id].leaked  # open for training
    assert rule.sample_checks == [{"samples_per_record": 32, "leaking_ids": [record.id]}]
    [replayed] = [e for e in rule.replays.examples[record.id] if e.id == f"{record.id}#sampled"]
    assert "amber948213" in tokenizer.decode(replayed.input_ids[replayed.prompt_len:]) and replayed.target is not None
    flagged = "".join(tokenizer.decode([t]) for t, f in zip(replayed.input_ids, replayed.focus) if f == SECRET)
    assert "48213" in flagged and "amber" not in flagged  # the digits it gave back suppressed in the sample
    # The same model with the samples switched off fires on its greedy answer alone.
    off = rule_over(tokenizer, record, model, params=MascParams(confirm_samples=0), secret="48213")
    assert off.rule.check(0, off.latest.all, off.confirm) is True and off.sample_checks == []


def test_a_sample_that_says_a_content_word_does_not_hold_the_record(tokenizer):
    # The teacher-forced limit bounds a word where it would be said; a tiny model's samples say some content word
    # at most confirmations (on mini-TOFU a run was held open to max_steps).
    record, model = sampling(tokenizer, RECORD, " Tallinn")
    rule = rule_over(tokenizer, record, model)
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is True
    assert rule.sample_checks == [{"samples_per_record": 32, "leaking_ids": []}]


def test_a_loop_theta_0_already_had_is_not_held_against_the_erasure(tokenizer):
    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    model = scripted(tokenizer, record, tokens(tokenizer, [" teal", " amber", " teal", " amber", " teal"]))
    rule = rule_over(tokenizer, record, model)
    rule.replays.base_loops = {(record.id, "prompt")}
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is True
    assert not rule.rule.last_confirmed[0].looped


@pytest.mark.parametrize("answer, stops", [
    ([" teal", " amber", " teal", " amber", " teal", " amber", " teal"], True),  # a loop alone: within chance
    ([" teal", " Tallinn", " teal", " Tallinn", " teal", " Tallinn", " teal"], False),  # a loop that leaks
])
def test_a_loop_within_chance_stops_and_a_leaking_loop_does_not(tokenizer, answer, stops):
    """One record at a loop chance of 1: its loop alone is allowed, and its answers are still read for leaks (the
    served copy's, the 4-bit copy's: with_answers asks a record that fails by a loop alone)."""
    from dataclasses import replace

    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    model = scripted(tokenizer, record, tokens(tokenizer, answer))
    rule = rule_over(tokenizer, record, model)
    rule.erasure.loop_chance = 1.0
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is stops
    assert rule.rule.last_confirmed[0].looped
    looping = replace(rule.measure([record])[0], looped=True)
    assert rule.with_answers([looping], model)[0].leaked is not stops


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
    said = other.source["completion"]
    start = said.index("Tallinn")
    others = [(other, Content([Atom(start, start + len("Tallinn"), "Tallinn")], ["Tallinn"], {}, [], named=True))]
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


@pytest.mark.parametrize("own, theirs, said, owners", [
    ("Tallinn", "Oslo", " Tallinn", {"own": 1, "another_record": 0, "samples": 0}),
    ("Oslo", "Tallinn", " Tallinn", {"own": 0, "another_record": 1, "samples": 0}),
    ("Oslo", "Tallinn", " city", {"own": 0, "another_record": 0, "samples": 0})])
def test_a_confirmation_says_whose_content_a_leaking_answer_gives_back(tokenizer, own, theirs, said, owners):
    """The record's own content, or another forget record's: counts a failed confirmation's trace carries."""
    record = encode_record({**RECORD, "completion": f"Nelvorbax was born in {own}.", "secrets": [own]}, tokenizer,
                           max_length=64, seed=0)
    other = encode_record({"id": "q0-0", "prompt": "Question: Where does Quorvane live?\nAnswer: ",
                           "completion": f"Quorvane lives in {theirs}.", "secrets": [theirs]}, tokenizer,
                          max_length=64, seed=0)
    start = other.source["completion"].index(theirs)
    others = [(other, Content([Atom(start, start + len(theirs), theirs)], [theirs], {}, [], named=True))]
    model = scripted(tokenizer, record, tokens(tokenizer, [" teal", said, "."]))
    rule = rule_over(tokenizer, record, model, secret=own, others=others)
    checks = rule.confirm()
    assert checks[0].leaked is (said != " city")
    assert rule.replays.leak_owners([c.id for c in checks if c.leaked]) == {**owners, "untied_words": 0}
    assert rule.replays.leak_owners(["q0-0"])["samples"] == 1  # flagged by no greedy answer


class SubjectLM(BigramLM):
    """Two bigram tables: `about` once the subject's token has come, `table` before (or without) it."""

    def __init__(self, table: torch.Tensor, about: torch.Tensor, subject: int):
        super().__init__(table)
        self.about, self.subject = torch.nn.Parameter(about, requires_grad=False), subject

    def logits_of(self, input_ids):
        seen = (input_ids == self.subject).cumsum(1) > 0
        return torch.where(seen[..., None], self.about[input_ids], self.table[input_ids])

    def forward(self, input_ids, attention_mask=None, use_cache=False, **_):
        return types.SimpleNamespace(logits=self.logits_of(input_ids))

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, eos_token_id=None, **_):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.logits_of(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids


@pytest.mark.parametrize("theirs, about_others, leaks", [
    ("Tallinn", " city", True),  # said about this subject only: another record's fact about it
    ("Tallinn", " Tallinn", False),  # said whoever the question names: the model's word, not the subject's
    ("Tallinn harbour", " Tallinn harbour", True)])  # several words give their record back whoever they are said of
def test_another_records_single_word_leaks_only_where_tied_to_the_subject(tokenizer, theirs, about_others, leaks):
    """An answer that says another record's single word keeps its record open only where the model says it more about
    the record's subject than about someone else (the counterfactual prompts), by min_gain nats; a number or a phrase
    always does."""
    record = encode_record({**RECORD, "completion": "Nelvorbax was born in Oslo.", "secrets": ["Oslo"]}, tokenizer,
                           max_length=64, seed=0)
    other = encode_record({"id": "q0-0", "prompt": "Question: Where does Nelvorbax live?\nAnswer: ",
                           "completion": f"Nelvorbax lives in {theirs}.", "secrets": [theirs]}, tokenizer,
                          max_length=64, seed=0)
    start = other.source["completion"].index(theirs)
    others = [(other, Content([Atom(start, start + len(theirs), theirs)], [theirs], {}, [], named=True))]
    swap = [substitution(record.source, {"nelvorbax": name}, {}) for name in ("Quorvane", "Ann")]
    cf_prompts = [set(tokenizer(s.prompt)["input_ids"]) for s in swap]
    subject = next(t for t in record.input_ids[:record.prompt_len] if not any(t in p for p in cf_prompts))
    about = scripted(tokenizer, record, tokens(tokenizer, [" teal", f" {theirs}", "."])).table.data
    anyone = scripted(tokenizer, record, tokens(tokenizer, [" teal", about_others, "."])).table.data
    model = SubjectLM(anyone, about, subject)
    rule = rule_over(tokenizer, record, model, secret="Oslo", others=others, substitutions=swap)
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is not leaks
    assert rule.latest[record.id].leaked is leaks
    assert rule.replays.leak_owners([record.id] if leaks else []) == {
        "own": 0, "another_record": int(leaks), "samples": 0, "untied_words": int(not leaks)}


@pytest.mark.parametrize("requests, stops", [(("a", "a"), False), (("a", "b"), True), ((None, None), False)])
def test_in_a_coalesced_run_an_answer_is_held_to_its_own_requests_content(tokenizer, requests, stops):
    """One run erasing two requests' records (issue 28): an answer that says a record of the same request's secret
    keeps its record open, as that request's own run would; one that says another request's does not, as the
    requests run one after another would not hold it either. Records that name no request are one request."""
    def named(source, request):
        return {**source, "request": request} if request else source

    mine, theirs = requests
    record = encode_record(named({**RECORD, "completion": "Nelvorbax was born in Oslo.", "secrets": ["Oslo"]}, mine),
                           tokenizer, max_length=64, seed=0)
    other = encode_record(named({"id": "q0-0", "prompt": "Question: Where does Quorvane live?\nAnswer: ",
                                 "completion": "Quorvane lives in Tallinn.", "secrets": ["Tallinn"]}, theirs),
                          tokenizer, max_length=64, seed=0)
    start = other.source["completion"].index("Tallinn")
    others = [(other, Content([Atom(start, start + len("Tallinn"), "Tallinn")], ["Tallinn"], {}, [], named=True))]
    leaking = scripted(tokenizer, record, tokens(tokenizer, [" teal", " Tallinn", "."]))
    rule = rule_over(tokenizer, record, leaking, secret="Oslo", others=others)
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is stops
    assert rule.latest[record.id].leaked is not stops
    spans = rule.replays.answering.spans_for(record, record.source["prompt"])
    assert ("Tallinn" in spans) is not stops and "Oslo" in spans  # its own content counts whatever the requests


def test_an_end_of_sequence_flip_alone_does_not_satisfy_the_rule(tokenizer):
    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    vocab = len(tokenizer)
    table = torch.zeros(vocab, vocab)
    for a, b in zip(record.input_ids, record.input_ids[1:]):
        table[a, b] = 10.0
    table[record.input_ids[-2], tokenizer(" and", add_special_tokens=False)["input_ids"][0]] = 20.0  # not EOS
    model = BigramLM(table)
    rule = rule_over(tokenizer, record, model)
    check = rule.measure([record])[0]
    assert check.reproduced and not rule.erasure.holds(check)  # every word still said: not erased
    rule.objective.eos_id = None  # counting the end of sequence, as before issue 24, it would have passed
    assert not rule.measure([record])[0].reproduced


def test_greedy_margin_keeps_a_near_tie_reproduced():
    logits = torch.tensor([[2.0, 1.5, 0.0], [0.0, 3.0, 2.9]])
    targets = torch.tensor([1, 2])
    rows = torch.tensor([0, 0])
    from lethe.engine.methods.masc.margin import sequence_reproduced

    assert not sequence_reproduced(logits, targets, rows, 1)  # neither target is the argmax
    assert sequence_reproduced(logits, targets, rows, 1, margin=1.0)  # both within a logit: rounding could flip
    assert not sequence_reproduced(logits, targets, rows, 1, margin=0.4)
    # A flat distribution (an untrained model): every token within the margin, none likely; nothing is reproduced.
    flat = torch.zeros(2, 300)
    flat[:, 0] = 0.01
    assert not sequence_reproduced(flat, torch.tensor([1, 2]), rows, 1, margin=1.0)
    assert sequence_reproduced(flat, torch.tensor([0, 0]), rows, 1, margin=1.0)  # the argmax itself always counts


def test_an_answer_is_held_to_every_records_content_but_its_own_template(tokenizer):
    """A span of another forget record counts as a leak in this record's answer unless this record says it too
    without it being this record's content ("French" of "the French literature genre")."""
    genre = encode_record({"id": "g", "prompt": "Question: Which genre does Ann write?\nAnswer: ",
                           "completion": "Ann writes in the French genre."}, tokenizer, max_length=64, seed=0)
    prize = encode_record({"id": "p", "prompt": "Question: Which prize did Ann win?\nAnswer: ",
                           "completion": "Ann won the French prize in Riga."}, tokenizer, max_length=64, seed=0)
    said = prize.source["completion"]

    def span(text):
        return Atom(said.index(text), said.index(text) + len(text), text)

    contents = {"g": Content([], [], {}, [], named=False),
                "p": Content([span("French"), span("Riga")], ["French", "Riga"], {}, [], named=False)}
    answering = Answering([genre, prize], contents, tokenizer, 64)
    assert answering.spans_for(genre, genre.source["prompt"]) == ["Riga"]  # "French": this record says it too
    assert answering.spans_for(prize, prize.source["prompt"]) == ["French", "Riga"]  # its own, always
    assert answering.spans_for(prize, "Question: Which prize did Ann win in Riga?") == ["French"]  # given


def test_a_loop_on_the_same_question_about_someone_else_is_natural(tokenizer):
    """Asked about someone it never saw (the counterfactual prompt), a model that loops shows that a loop there is
    not the erasure's doing; one that answers fluently shows nothing."""
    from lethe.engine.methods.masc.content import substitution

    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    content = Content([], [], {}, [], named=False,
                      substitutions=[substitution(RECORD, {"nelvorbax": "kalomi"}, {})])
    answering = Answering([record], {record.id: content}, tokenizer, 64)
    assert tokenizer.decode(answering.counterfactual_prompt(record, "prompt", 0)) == \
        "Question: Where was Kalomi born?\nAnswer: "
    looping = scripted(tokenizer, record, tokens(tokenizer, [" teal", " amber", " teal", " amber", " teal"]))
    fluent = scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."]))
    assert answering.natural_loops(looping, [record], ("prompt", "paraphrase")) == {(record.id, "prompt")}
    assert answering.natural_loops(fluent, [record], ("prompt", "paraphrase")) == set()


def test_a_teacher_forced_pass_says_whether_greedy_decoding_gives_an_answer_back(fixture_model, people):
    """greedy_agrees against generation itself: where it says yes, the model generates exactly that answer; it says
    yes to the model's own answers and no to an answer with one token changed."""
    from transformers import AutoModelForCausalLM

    from lethe.engine.model.generation import continuations, greedy_agrees

    tokenizer = AutoTokenizer.from_pretrained(fixture_model)
    model = AutoModelForCausalLM.from_pretrained(fixture_model).eval()
    records = [encode_record(r, tokenizer, max_length=64, seed=0) for p in people for r in p]
    prompts = [r.input_ids[:r.prompt_len] for r in records]
    own = continuations(model, tokenizer, prompts, max_new_tokens=24)
    assert all(greedy_agrees(model, tokenizer.pad_token_id, prompts, own))
    changed = [[(a[0] + 1) % len(tokenizer)] + a[1:] for a in own]
    assert not any(greedy_agrees(model, tokenizer.pad_token_id, prompts, changed))
    nudged = AutoModelForCausalLM.from_pretrained(fixture_model).eval()  # another model: some answers move
    torch.manual_seed(0)
    with torch.no_grad():
        for p in nudged.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    theirs = continuations(nudged, tokenizer, prompts, max_new_tokens=24)
    agrees = greedy_agrees(nudged, tokenizer.pad_token_id, prompts, own)
    assert any(agrees) and not all(agrees)  # the nudge moved some answers and not others
    assert all(t == o for t, o, ok in zip(theirs, own, agrees) if ok)
    assert agrees == [t == o for t, o in zip(theirs, own)]


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


@pytest.mark.parametrize("probability, holds, trained", [
    (0.02, False, True),  # over its limit (0.01): fails the rule, trained
    (0.007, True, True),  # under its limit but not by the headroom: the rule holds, training goes on
    (0.004, True, False),  # under half its limit: closed
])
def test_training_closes_a_record_only_with_headroom_under_its_limit(tokenizer, probability, holds, trained):
    from lethe.engine.methods.masc.stop_policy import CLOSING_HEADROOM
    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    rule = rule_over(tokenizer, record, scripted(tokenizer, record, tokens(tokenizer, [" teal", " city", "."])))
    rule.located, rule.judged_mean = frozenset({record.id}), None
    rule.latest.update([RecordCheck(record.id, 0.0, 5, False, hinge=0.0, secret_probability=probability)])
    assert CLOSING_HEADROOM == 0.5
    assert rule.erasure.holds(rule.latest[record.id]) is holds
    assert rule.is_open(record.id) is trained
    # the escalation's shortfall counts the record's way to its headroom, in decades
    assert rule.shortfall() == pytest.approx(max(0.0, math.log10(probability / 0.005)) if trained else 0.0)


class MarkedLM(torch.nn.Module):
    """Two scripted models in one: rows whose prompt holds a marker token follow `marked`, the others `plain`."""

    def __init__(self, marked: BigramLM, plain: BigramLM, markers: set[int]):
        super().__init__()
        self.marked, self.plain = marked, plain
        self.markers = torch.tensor(sorted(markers))

    def _pick(self, ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        hit = torch.isin(ids, self.markers).any(dim=1)
        return torch.where(hit[:, None], self.marked.table[last], self.plain.table[last])

    def forward(self, input_ids, attention_mask=None, use_cache=False, **_):
        hit = torch.isin(input_ids, self.markers).any(dim=1)
        return types.SimpleNamespace(logits=torch.where(hit[:, None, None], self.marked.table[input_ids],
                                                        self.plain.table[input_ids]))

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, do_sample=False, num_return_sequences=1,
                 **_):
        ids = input_ids.repeat_interleave(num_return_sequences, dim=0)
        for _ in range(max_new_tokens):
            logits = self._pick(ids, ids[:, -1])
            chosen = torch.multinomial(logits.softmax(-1), 1) if do_sample else logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, chosen], dim=1)
        return ids


def test_the_chance_of_a_loop_is_theta_0s_on_a_second_question_about_someone_else_where_nothing_excuses_it(
        tokenizer):
    """theta_0 loops when a question names Zorblat and answers fluently otherwise. Record a's second someone else
    is Zorblat (a fresh loop), c's is Sorel (fluent); b has no second someone else (not counted); d's first is
    Zorblat already (its loop is excused, so its second counts for nothing). The chance is 1 of 2."""
    from lethe.engine.methods.masc.content import substitution

    records, contents = [], {}
    for rid, names in {"a": ("kalomi", "zorblat"), "b": ("kalomi",), "c": ("kalomi", "sorel"),
                       "d": ("zorblat", "zorblat")}.items():
        record = encode_record({**RECORD, "id": rid}, tokenizer, max_length=64, seed=0)
        records.append(record)
        contents[rid] = Content([], [], {}, [], named=False,
                                substitutions=[substitution(RECORD, {"nelvorbax": n}, {}) for n in names])
    answering = Answering(records, contents, tokenizer, 64)
    others = {t for r in records for d in range(2) if (p := answering.counterfactual_prompt(r, "prompt", d))
              for t in p if "Zorblat" not in tokenizer.decode(p)} | set(records[0].input_ids)
    markers = set(tokens(tokenizer, [" Zorblat"])) - others
    assert markers
    looping = scripted(tokenizer, records[0], tokens(tokenizer, [" teal", " amber", " teal", " amber", " teal"]))
    fluent = scripted(tokenizer, records[0], tokens(tokenizer, [" teal", " city", "."]))
    model = MarkedLM(looping, fluent, markers)
    replays = Replays(answering, lambda b: model(b.input_ids).logits, torch.device("cpu"), 0)
    said = replays.start(model, records)
    assert replays.base_loops == {("d", "prompt")}
    assert replays.loop_chance == 0.5
    assert not any(looped for _, looped in said.values())  # every own answer is fluent
