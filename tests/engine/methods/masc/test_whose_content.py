"""Whose content an answer gives back (issues 24 and 28): its own record's, another forget record's, another
request's in a coalesced run, a word tied to the subject or not; on a scripted model (scripted_rule)."""
import types

import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.data.records import encode_record
from lethe.engine.methods.masc.answers import CHANCE_RECORDS, Answering
from lethe.engine.methods.masc.content import Atom, substitution
from lethe.engine.methods.masc.destination import Content
from tests.engine.methods.masc.scripted_rule import RECORD, BigramLM, named_content, rule_over, scripted, tokens

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


@pytest.fixture(scope="module")
def tokenizer(fixture_model):
    return AutoTokenizer.from_pretrained(fixture_model)


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
    others = [(other, named_content(other, theirs))]
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
    others = [(other, named_content(other, theirs))]
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
    others = [(other, named_content(other, "Tallinn"))]
    leaking = scripted(tokenizer, record, tokens(tokenizer, [" teal", " Tallinn", "."]))
    rule = rule_over(tokenizer, record, leaking, secret="Oslo", others=others)
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is stops
    assert rule.latest[record.id].leaked is not stops
    spans = rule.replays.answering.spans_for(record, record.source["prompt"])
    assert ("Tallinn" in spans) is not stops and "Oslo" in spans  # its own content counts whatever the requests




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




def test_a_single_word_said_about_someone_else_for_two_records_is_vocabulary_not_content(tokenizer):
    """Issue 28: request 10 of the chain, with only world facts left to retain, held "mother" and "literature" against
    answers as content. A single word theta_0 says asked about someone else, for at least CHANCE_RECORDS records of
    the request, is dropped from the spans and from the words replays suppress; numbers, phrases, and a word said
    about someone else for one record only (a confusion with it) still count."""
    records = [encode_record({"id": f"r{i}", "prompt": f"Question: What did Ann do ({i})?\nAnswer: ",
                              "completion": "Ann's mother wrote literature in Riga Town in 1977."},
                             tokenizer, max_length=64, seed=0) for i in range(3)]
    said = records[0].source["completion"]

    def span(text):
        return Atom(said.index(text), said.index(text) + len(text), text)

    atoms = [span("mother"), span("literature"), span("Riga"), span("Town"), span("1977")]
    contents = {r.id: Content(atoms, ["mother", "literature", "Riga Town", "1977", "Riga"], {}, [], named=False)
                for r in records}
    answering = Answering(records, contents, tokenizer, 64)
    assert CHANCE_RECORDS == 2
    answering.about_others = {"r0": ["Bo's mother wrote literature in 1977 in Riga Town.", "Riga."],
                              "r1": ["His mother, a literature teacher."], "r2": ["Nothing."]}
    assert answering.hold_chance_words() == 2  # "Riga" only for r0; "Riga Town" and "1977" are not single words
    assert answering.spans_of[None] == ["Riga Town", "1977", "Riga"]
    assert answering.content_words_of[None] == {"riga", "town"}
    assert answering.spans_for(records[0], records[0].source["prompt"]) == ["Riga Town", "1977", "Riga"]
