"""A closed record's clean greedy answer rides along as a pin (params.pin_answers): each of its tokens HELD, kept the
argmax by keep_gap logits; those ridden longest ago first; never a leaking answer, a chosen record's or an open
record's."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from lethe.engine.data.records import HELD, IGNORE, SECRET, SUPPRESS, TEMPLATE, Batch, encode_record
from lethe.engine.methods.masc.answers import Answering
from lethe.engine.methods.masc.content import Atom
from lethe.engine.methods.masc.destination import Content
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.replay import Replays
from tests.engine.methods.masc.test_secrets import FixedTrainable


def test_held_tokens_keep_their_argmax_by_a_margin_and_nothing_else_by_loop():
    """A HELD token adds lambda_keep * relu(keep_gap - g) (g: its logit minus the largest other) to the loss, token
    mean over the held tokens; it is neither suppressed nor moved to its target, and the other rows' hinge and KL
    are what they are without it."""
    g = torch.Generator().manual_seed(3)
    z, z0 = torch.randn(2, 6, 9, generator=g) * 2, torch.randn(2, 6, 9, generator=g)
    labels = torch.tensor([[IGNORE, 3, 4, 5, 6, 2], [IGNORE, IGNORE, 1, 7, 8, 0]])
    focus = torch.tensor([[SUPPRESS, TEMPLATE, SECRET, TEMPLATE, SUPPRESS, TEMPLATE],
                          [SUPPRESS, SUPPRESS, HELD, HELD, HELD, HELD]])
    target_ids = torch.randint(0, 9, (2, 6, 3), generator=g)
    target_probs = torch.softmax(torch.randn(2, 6, 3, generator=g), -1)
    params = MascParams.from_dict({"k": 3, "lambda_keep": 0.7, "keep_gap": 1.5}).resolved()

    def loss(rows: slice):
        batch = Batch(torch.zeros(2, 6, dtype=torch.long)[rows], torch.ones(2, 6)[rows], labels[rows], focus[rows],
                      target_ids[rows], target_probs[rows])
        return Masc(params, FixedTrainable(z[rows], z0[rows]), pad_id=0).loss(batch, None)

    total, parts = loss(slice(0, 2))
    alone_total, alone = loss(slice(0, 1))
    hinges = []
    for t in range(2, 6):
        y, row = int(labels[1, t]), z[1, t - 1]
        gap = float(row[y]) - max(float(row[v]) for v in range(9) if v != y)
        hinges.append(max(0.0, 1.5 - gap))
    assert sum(hinges) > 0
    assert parts["held"] == pytest.approx(sum(hinges) / len(hinges), rel=1e-5)
    assert parts["forget"] == pytest.approx(alone["forget"], rel=1e-6)
    assert parts["target"] == pytest.approx(alone["target"], rel=1e-6)
    assert float(total) == pytest.approx(float(alone_total) + 0.7 * parts["held"], rel=1e-5)
    assert math.isfinite(float(total))


@pytest.fixture(scope="module")
def tokenizer(fixture_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(fixture_model)


RECORD = {"id": "p0-0", "prompt": "Question: Where was Nelvorbax born?\nAnswer: ",
          "completion": "Nelvorbax was born in Tallinn.", "secrets": ["Tallinn"]}


@pytest.mark.slow  # the tokenizer of the trained fixture model
def test_closed_records_clean_answers_ride_held_those_ridden_longest_ago_first(tokenizer):
    from tests.engine.methods.masc.scripted_rule import scripted, tokens

    records = [encode_record({**RECORD, "id": rid}, tokenizer, max_length=64, seed=0) for rid in "abcde"]
    start = RECORD["completion"].index("Tallinn")
    contents = {r.id: Content([Atom(start, start + 7, "Tallinn")], ["Tallinn"], {}, [], named=True) for r in records}
    policy = scripted(tokenizer, records[0], tokens(tokenizer, [" city", "."]))
    replays = Replays(Answering(records, contents, tokenizer, 64), lambda b: policy(b.input_ids).logits,
                      torch.device("cpu"), 0)
    replays.refresh(policy, records)
    e_prompt = next(e for e in replays.examples["e"] if e.id == "e#prompt")
    replays.examples["e"] = [replace(e_prompt, focus=[*e_prompt.focus[:-1], SECRET])]  # leaks: never held
    closed = {"a", "b", "d", "e"}.__contains__  # c is open
    rng = random.Random(0)

    def pins(n: int) -> list[str]:
        return [e.id for e in replays.riding([records[0]], 0, rng, n, closed)]

    assert pins(0) == []
    assert pins(1) == ["b#prompt"]  # a is chosen, c open, e leaking, a sample never held
    assert pins(1) == ["d#prompt"]
    assert pins(2) == ["b#prompt", "d#prompt"]
    assert pins(5) == ["b#prompt", "d#prompt"]
    assert replays.riding([records[0]], 0, rng, 2, None) == []  # holdout mode: nothing is closed
    held = replays.riding([records[0]], 0, rng, 1, closed)[0]
    kept = next(e for e in replays.examples[held.id.split("#")[0]] if e.id == held.id)
    assert held.focus[held.prompt_len:] == [HELD] * (len(held.input_ids) - held.prompt_len)
    assert held.focus[:held.prompt_len] == kept.focus[:kept.prompt_len]
    assert HELD not in kept.focus  # the replayed answer itself is unchanged


@pytest.mark.slow  # the tokenizer of the trained fixture model
def test_answers_are_pinned_only_once_a_confirmation_has_failed(tokenizer):
    """A run that fires at its first confirmation never pins (a single request pays nothing); after a failed one the
    policy pins pin_answers answers a step; none without lambda_keep."""
    from tests.engine.methods.masc.scripted_rule import rule_over, scripted, tokens

    record = encode_record(RECORD, tokenizer, max_length=64, seed=0)
    looping = scripted(tokenizer, record, tokens(tokenizer, [" teal", " amber", " teal", " amber", " teal", " amber"]))
    rule = rule_over(tokenizer, record, looping)
    assert rule.pins() == 0
    assert rule.rule.check(0, rule.latest.all, rule.confirm) is False  # the answer loops
    assert rule.pins() == MascParams().pin_answers == 4
    rule.params = replace(rule.params, lambda_keep=0.0)
    assert rule.pins() == 0
