"""The stop rule reads the model's answers (issue 24), on a scripted model (scripted_rule): every teacher-forced
condition holds while the answer loops or leaks; loops within chance, samples, headroom at closing."""
import math
import types

import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.data.records import SECRET, encode_record
from lethe.engine.methods.masc.answers import Answering
from lethe.engine.methods.masc.content import substitution
from lethe.engine.methods.masc.destination import Content
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.replay import Replays
from lethe.engine.methods.masc.stop_rule import RecordCheck
from tests.engine.methods.masc.scripted_rule import LEAD, RECORD, BigramLM, rule_over, scripted, tokens

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


@pytest.fixture(scope="module")
def tokenizer(fixture_model):
    return AutoTokenizer.from_pretrained(fixture_model)


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




def test_a_loop_on_the_same_question_about_someone_else_is_natural(tokenizer):
    """Asked about someone it never saw (the counterfactual prompt), a model that loops shows that a loop there is
    not the erasure's doing; one that answers fluently shows nothing."""

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
