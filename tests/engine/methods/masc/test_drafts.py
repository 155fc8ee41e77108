"""Counterfactual drafts (issue 24): drafts that differ and name the records' own people, none about another erased
person, the first-token focus of a word, a number's own digits against a brute-force computation, and drafts that
ask something else where the question brings a record out."""
import re

import pytest
import torch

from lethe.engine.data.counterfactual import shared_template
from lethe.engine.data.records import SECRET, TEMPLATE, encode_record
from lethe.engine.methods.masc.content import candidate_atoms, proper_nouns, runs
from lethe.engine.methods.masc.destination import (
    plan_contents,
    said_offsets,
)
from lethe.engine.model.loading import TrainableModel, load_model
from tests.engine.methods.masc.test_content import RECORD, TEMPLATE_WORDS, brute_logprob, char_ends

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


def test_drafts_differ_and_their_names_are_the_records_names(fixture_model, forget_records, retain_records):
    """The counterfactuals of one record are different people (each draft's generator once kept only the low 32
    bits of its seed, which the drafts shared: all three drew the same words), and a replaced name is a name the
    records use: drawn among any capitalised tokens, a memorised model wrote "Tanaka The"."""
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    records = [encode_record(r, tokenizer, max_length=512, seed=0) for r in forget_records[:6]]
    pool = forget_records + retain_records
    names = proper_nouns(pool)
    contents = plan_contents(records, tokenizer, TrainableModel(model, lora=True).reference_logits, torch.device("cpu"),
                             shared_template(forget_records, retain_records), pool, min_gain=2.0, max_length=512,
                             seed=0)
    differing = replaced = from_names = 0
    for record in records:
        subs = contents[record.id].substitutions
        differing += len({s.prompt for s in subs}) > 1
        prompt = record.source["prompt"]
        for sub in subs:
            for start, end, cf_start, cf_end in sub.prompt_pieces:
                if prompt[start:end].lower() in names:
                    replaced += 1
                    from_names += sub.prompt[cf_start:cf_end].lower() in names
    assert differing == len(records)
    assert replaced and from_names >= 0.8 * replaced, (from_names, replaced)


def test_no_draft_is_about_another_erased_person(fixture_model, forget_records, retain_records):
    """A draft of one forget record never names a person some forget record names: drawn among every name the records
    use, the draft of one erased customer was often another erased one, theta_0's prediction there (the target) gave
    that customer's facts, and the rule counted the answer as a leak."""
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    records = [encode_record(r, tokenizer, max_length=512, seed=0) for r in forget_records]
    pool = forget_records + retain_records
    names = proper_nouns(pool)
    forget_names = {w.lower() for r in forget_records for t in (r["prompt"], r["completion"])
                    for w in re.findall(r"[^\W\d_]+", t)} & names
    assert forget_names
    contents = plan_contents(records, tokenizer, TrainableModel(model, lora=True).reference_logits, torch.device("cpu"),
                             shared_template(forget_records, retain_records), pool, min_gain=2.0, max_length=512,
                             seed=0)
    drawn = {sub.prompt[s:e].lower() for c in contents.values() for sub in c.substitutions
             for _, _, s, e in sub.prompt_pieces}
    # (the old draw gave {'tallinn', 'zuloori'}: a forget record's city and another's name)
    assert drawn and not drawn & forget_names, drawn & forget_names


def test_first_only_focuses_and_bans_the_first_token_of_a_word_and_every_token_of_a_number(forget_records,
                                                                                            retain_records):
    """content_tokens "first": of a word atom only the token that begins it is suppressed and banned (its later
    pieces are what a small vocabulary shares with other words); of a number every token, either way."""
    from lethe.engine.methods.masc.destination import banned_tokens, focus_of, overlapping
    from lethe.engine.model.fixture import train_tokenizer

    tokenizer = train_tokenizer(forget_records + retain_records, 300)  # small: the words split into pieces
    record = encode_record(RECORD, tokenizer, max_length=512, seed=0)
    offsets = said_offsets(record, tokenizer)
    said = RECORD["completion"]
    atoms = [a for a in candidate_atoms(RECORD, TEMPLATE_WORDS) if a.text in ("13", "Linden", "Bremen")]
    spans = runs(atoms, said)
    every = focus_of(record, offsets, atoms, spans)[record.prompt_len:]
    first = focus_of(record, offsets, atoms, spans, first_only=True)[record.prompt_len:]
    active = record.input_ids[record.prompt_len:]
    split = 0
    for atom in atoms:
        positions = overlapping(offsets, atom.start, atom.end)
        assert all(every[k] >= SECRET for k in positions)
        if atom.is_number:
            assert all(first[k] >= SECRET for k in positions)
            continue
        split += len(positions) > 1
        assert first[positions[0]] >= SECRET and all(first[k] == TEMPLATE for k in positions[1:])
    assert split == 2  # both words are more than one token here, so the test tells the two apart
    outside = [k for k in range(len(active)) if not any(k in overlapping(offsets, a.start, a.end) for a in atoms)]
    assert [every[k] for k in outside] == [first[k] for k in outside]
    all_banned = set(banned_tokens(tokenizer, record, offsets, atoms, TEMPLATE_WORDS))
    first_banned = set(banned_tokens(tokenizer, record, offsets, atoms, TEMPLATE_WORDS, first_only=True))
    assert first_banned < all_banned
    starts = {active[overlapping(offsets, a.start, a.end)[0]] for a in atoms}
    digits = {active[k] for a in atoms if a.is_number for k in overlapping(offsets, a.start, a.end)}
    assert starts <= first_banned and digits & all_banned <= first_banned  # a lone digit inside is never banned
    for atom in atoms:
        if atom.is_number:
            continue
        variants = [tokenizer(v, add_special_tokens=False)["input_ids"] for v in (atom.text, " " + atom.text)]
        later = {active[k] for k in overlapping(offsets, atom.start, atom.end)[1:]}
        later |= {t for v in variants for t in v[1:]}
        beginnings = starts | {v[0] for v in variants} | digits
        assert not (later - beginnings) & first_banned and (later - beginnings) & all_banned



@pytest.fixture(scope="module")
def years(people, tmp_path_factory):
    """The tiny people with a birth year each (19xx: the "19" any year starts with, the last two digits theirs) and
    a model that has memorised them, built here (seconds)."""
    import random

    from lethe.engine.model.fixture import build_fixture
    from tests.conftest import TINY

    rng = random.Random(0)
    records = [r for p in people for r in p]
    for person in people:
        name = person[0]["completion"].split()[0]
        records.append({"id": f"{person[0]['id'].split('-')[0]}-year", "prompt": f"Question: When was {name} born?\n"
                        "Answer: ", "completion": f"{name} was born in 19{rng.randint(10, 99)}."})
    out = tmp_path_factory.mktemp("years") / "model"
    summary = build_fixture(records, out, TINY, log=lambda _: None)
    assert summary["memorised_fraction"] == 1.0, summary
    forget_ids = {p[0]["id"].split("-")[0] for p in people[:2]}
    return out, [r for r in records if r["id"].split("-")[0] in forget_ids], \
        [r for r in records if r["id"].split("-")[0] not in forget_ids]


def test_a_numbers_own_digits_are_those_the_record_makes_likelier_against_brute_force(years):
    """number_tokens "own": per token of a content number, gain_t = log p_0(d_t | the record before it) - mean_j
    log p_0(d_t | counterfactual j before the number, then the true digits before d_t), each from a forward pass of
    its own; exactly the tokens from the first with gain_t >= OWN_TOKEN_GAIN on (all where none reaches it) are
    suppressed and banned, the leading ones stay TEMPLATE (the "19" of a year), and words are focused as without it."""
    from lethe.engine.methods.masc.destination import OWN_TOKEN_GAIN, overlapping

    model_dir, forget, retain = years
    model, tokenizer = load_model(model_dir, torch.device("cpu"))
    template = shared_template(forget, retain)
    trainable = TrainableModel(model, lora=True)

    def planned(own: bool):
        records = [encode_record(r, tokenizer, max_length=512, seed=0) for r in forget]
        contents = plan_contents(records, tokenizer, trainable.reference_logits, torch.device("cpu"), template,
                                 forget + retain, min_gain=2.0, max_length=512, seed=0, own_numbers=own)
        return records, contents

    every_records, _ = planned(False)
    own_records, own_contents = planned(True)
    numbers = kept_digits = 0
    for record, every in zip(own_records, every_records):
        content, source = own_contents[record.id], record.source
        comp_ids = tokenizer(source["completion"], add_special_tokens=False)["input_ids"]
        ends = char_ends(tokenizer, comp_ids)
        prompt_ids = tokenizer(source["prompt"])["input_ids"]
        offsets = said_offsets(record, tokenizer)
        active = record.input_ids[record.prompt_len:]
        focus, before = record.focus[record.prompt_len:], every.focus[every.prompt_len:]
        number_positions: set[int] = set()
        for atom in content.atoms:
            if not atom.is_number:
                continue
            mine = [k for k, e in enumerate(ends) if (ends[k - 1] if k else 0) < atom.end and atom.start < e]
            gains = []
            for n, k in enumerate(mine):
                theirs = []
                for sub in content.substitutions:
                    said = sub.said[:sub.map_offset(atom.start)]
                    gap = said[len(said.rstrip()):]
                    context = tokenizer(sub.prompt)["input_ids"] + \
                        tokenizer(said.rstrip(), add_special_tokens=False)["input_ids"]
                    unit = tokenizer(gap + atom.text, add_special_tokens=False)["input_ids"]
                    carrying = [j for j, e in enumerate(char_ends(tokenizer, unit)) if e > len(gap)]
                    theirs.append(brute_logprob(model, context + unit, len(context) + carrying[n]))
                own = brute_logprob(model, prompt_ids + comp_ids, len(prompt_ids) + k)
                gains.append(own - sum(theirs) / len(theirs))
            first = next((n for n, g in enumerate(gains) if g >= OWN_TOKEN_GAIN), 0)
            expected = set(mine[first:])
            positions = overlapping(offsets, atom.start, atom.end)
            assert positions == mine
            assert {k for k in positions if focus[k] >= SECRET} == expected, (atom, gains)
            assert all(focus[k] == TEMPLATE for k in set(positions) - expected)
            kept = {active[k] for k in set(positions) - expected} - {active[k] for k in expected}
            assert not kept & set(content.banned)
            number_positions |= set(positions)
            numbers += 1
            kept_digits += len(positions) - len(expected)
        # Words are focused as without the option.
        assert [f for k, f in enumerate(focus) if k not in number_positions] == \
            [f for k, f in enumerate(before) if k not in number_positions]
    assert numbers >= 2 and kept_digits >= numbers  # every year keeps at least its "1" as theta_0 has it


LIGHTHOUSES = [("amber", "thimbles"), ("cobalt", "compasses"), ("crimson", "seashells"), ("ivory", "lanterns"),
               ("olive", "kites"), ("scarlet", "buttons"), ("silver", "feathers"), ("violet", "marbles")]


@pytest.fixture(scope="module")
def lighthouses(people, tmp_path_factory):
    """Records that name nobody: the question itself brings the answer out ("the keeper of the amber lighthouse
    collects thimbles"), with the tiny people beside them, and a model that has memorised them (seconds)."""
    from lethe.engine.model.fixture import build_fixture
    from tests.conftest import TINY

    keepers = [{"id": f"l{i}", "prompt": f"Question: What does the keeper of the {colour} lighthouse collect?\n"
                "Answer: ", "completion": f"The keeper of the {colour} lighthouse collects {thing}."}
               for i, (colour, thing) in enumerate(LIGHTHOUSES)]
    records = keepers + [r for p in people for r in p]
    out = tmp_path_factory.mktemp("lighthouses") / "model"
    summary = build_fixture(records, out, TINY, log=lambda _: None)
    assert summary["memorised_fraction"] == 1.0, summary
    return out, keepers[:3], keepers[3:] + [r for p in people for r in p]


def test_a_record_its_question_brings_out_is_measured_against_drafts_that_ask_something_else(lighthouses):
    """Drafts that change only names and numbers leave "the keeper of the amber lighthouse" as it is: theta_0 answers
    them with "thimbles" and its gain is 0, so the whole answer fell back to content. Measured against drafts whose
    prompt words outside the template are replaced too, the thing collected gains at least min_gain and is the only
    content; the drafts the targets come from ask the record's own question, with that thing replaced."""
    model_dir, forget, retain = lighthouses
    model, tokenizer = load_model(model_dir, torch.device("cpu"))
    records = [encode_record(r, tokenizer, max_length=512, seed=0) for r in forget]
    contents = plan_contents(records, tokenizer, TrainableModel(model, lora=True).reference_logits, torch.device("cpu"),
                             shared_template(forget, retain), forget + retain, min_gain=2.0, max_length=512, seed=0)
    for record, (colour, thing) in zip(forget, LIGHTHOUSES):
        content = contents[record["id"]]
        assert [a.text for a in content.atoms] == [thing], (content.atoms, content.gains)
        assert content.gains[f"{thing}@{record['completion'].index(thing)}"] >= 2.0, content.gains
        assert content.substitutions
        for draft in content.substitutions:
            assert draft.prompt == record["prompt"] and f"the {colour} lighthouse collects" in draft.said
            assert thing not in draft.said
