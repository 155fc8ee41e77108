"""Content and destinations (issue 24): counterfactual substitution, memorisation gain against a brute-force
computation, the banned tokens, and targets that never put mass on a masked token."""
import math
import re

import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.data.counterfactual import shared_template
from lethe.engine.data.records import SECRET, SUPPRESS, TEMPLATE, EncodedRecord, encode_record
from lethe.engine.methods.masc.content import Atom, candidate_atoms, frequent_template, proper_nouns, runs, substitution
from lethe.engine.methods.masc.destination import (
    Counterfactuals,
    plan_contents,
    said_offsets,
    sparse,
    targets_for,
)
from lethe.engine.methods.masc.memorisation import FALLBACK_BAND
from lethe.engine.model.loading import TrainableModel, load_model

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

RECORD = {"id": "r", "prompt": "Q: Where does Mona Okafor live?\nA:",
          "completion": " Mona Okafor lives at 13 Linden Alley, Bremen, and writes to mona.ok@mailbox.com."}
TEMPLATE_WORDS = {"where", "does", "live", "lives", "at", "and", "writes", "to", "q", "a"}


def test_candidates_leave_out_the_template_and_what_the_prompt_gives():
    atoms = [a.text for a in candidate_atoms(RECORD, TEMPLATE_WORDS)]
    # Mona Okafor is in the question (also inside the e-mail address); an address is its words and digits.
    assert atoms == ["13", "Linden", "Alley", "Bremen", "ok", "mailbox", "com"]
    spans = runs(candidate_atoms(RECORD, TEMPLATE_WORDS), RECORD["completion"])
    assert [RECORD["completion"][s:e] for s, e in spans] == ["13 Linden Alley", "Bremen", "ok", "mailbox", "com"]
    digits = {"id": "d", "prompt": "Q: Call 555?", "completion": " Call 555-4584 or +30 726."}
    assert [a.text for a in candidate_atoms(digits, {"call", "or"})] == ["4584", "30", "726"]


def test_a_counterfactual_replaces_consistently_and_maps_offsets_back():
    sub = substitution(RECORD, {"mona": "rosa", "okafor": "berg", "linden": "heron"}, {"13": "47"})
    assert sub.prompt == "Q: Where does Rosa Berg live?\nA:"
    assert sub.said == " Rosa Berg lives at 47 Heron Alley, Bremen, and writes to rosa.ok@mailbox.com."
    completion = RECORD["completion"]
    for atom in candidate_atoms(RECORD, TEMPLATE_WORDS):
        start = sub.map_offset(atom.start)
        assert sub.said[start - 1] == completion[atom.start - 1]  # the same separator before it
        if atom.text in ("Alley", "Bremen", "mailbox"):  # not replaced: the same word, shifted
            assert sub.said[start:start + len(atom.text)] == atom.text
    assert sub.map_offset(len(completion) - 1) == len(sub.said) - 1  # the final "." maps to the final "."
    assert sub.replace_prompt("Q: What is the address of Mona Okafor (13)?") == \
        "Q: What is the address of Rosa Berg (47)?"


def test_special_tokens_are_kept_out_of_a_counterfactual_and_names_are_told_by_their_spelling():
    chat = {"id": "c", "prompt": "<|user|>Where does Mona live?<|end|>", "completion": " Mona lives in Bremen."}
    sub = substitution(chat, {"mona": "rosa", "user": "x", "end": "y"}, {}, protected=("<|user|>", "<|end|>"))
    assert sub.prompt == "<|user|>Where does Rosa live?<|end|>"
    records = [chat, {"prompt": "Where is Bremen?", "completion": " In the north. Where else?"}]
    assert proper_nouns(records) == {"mona", "bremen"}  # "Where" starts sentences only


def _lp(model, ids: list[int], position: int) -> float:
    """log p(ids[position] | ids[:position]), one forward pass of its own: the brute force."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:position]])).logits[0, -1]
    return float(torch.log_softmax(logits.float(), -1)[ids[position]])


def _char_ends(tokenizer, ids: list[int]) -> list[int]:
    return [len(tokenizer.decode(ids[:k + 1])) for k in range(len(ids))]


def test_memorisation_gain_and_content_selection_against_brute_force(fixture_model, forget_records, retain_records):
    """gain(s) = log p_0(s | the record before s) - mean_j log p_0(s | counterfactual j before s), each
    log-probability here from one forward pass per token on the text as a string, tokenised from scratch."""
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    records = [encode_record(r, tokenizer, max_length=512, seed=0) for r in forget_records[:6]]
    template = shared_template(forget_records, retain_records)
    trainable = TrainableModel(model, lora=True)
    contents = plan_contents(records, tokenizer, trainable.reference_logits, torch.device("cpu"), template,
                             forget_records + retain_records, min_gain=2.0, max_length=512, seed=0)

    def logprob_of(prompt: str, before: str, atom: str) -> float:
        """log p(atom | prompt + before), the atom tokenised with the whitespace before it; as on the record's side,
        only the tokens that carry the atom's characters count (not a token of that whitespace alone)."""
        context = tokenizer(prompt)["input_ids"] + tokenizer(before.rstrip(), add_special_tokens=False)["input_ids"]
        gap = before[len(before.rstrip()):]
        unit = tokenizer(gap + atom, add_special_tokens=False)["input_ids"]
        ends = _char_ends(tokenizer, unit)
        carrying = [k for k, e in enumerate(ends) if e > len(gap)]
        return sum(_lp(model, context + unit, len(context) + k) for k in carrying)

    checked = chosen_count = fallbacks = 0
    frequent = frequent_template(forget_records + retain_records)
    for record in records:
        source, content = record.source, contents[record.id]
        completion = source["completion"]
        comp_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        ends = _char_ends(tokenizer, comp_ids)
        prompt_ids = tokenizer(source["prompt"])["input_ids"]
        gains: dict[str, float] = {}
        atoms = candidate_atoms(source, template) or candidate_atoms(source, frequent & template)
        for atom in atoms:
            if atom.key in gains:
                continue  # a recurring word is decided once, where it first occurs
            mine = [k for k, e in enumerate(ends) if (ends[k - 1] if k else 0) < atom.end and atom.start < e]
            own = sum(_lp(model, prompt_ids + comp_ids, len(prompt_ids) + k) for k in mine)
            others = [logprob_of(sub.prompt, sub.said[:sub.map_offset(atom.start)], atom.text)
                      for sub in content.substitutions]
            gains[atom.key] = own - sum(others) / len(others)
            assert content.gains[f"{atom.text}@{atom.start}"] == pytest.approx(gains[atom.key], abs=2e-3)
            checked += 1
        # Content: the atoms reaching min_gain; where none does, those within FALLBACK_BAND of the record's best.
        reached = {k for k, g in gains.items() if g >= 2.0}
        fallback = not reached and bool(gains)
        best = max(gains.values(), default=0.0)
        expected = reached or {k for k, g in gains.items() if g >= best - FALLBACK_BAND}
        assert {a.key for a in content.atoms} == expected, (gains, content.atoms)
        chosen_count += len(reached)
        fallbacks += fallback
        # Exactly the tokens of the content atoms are focused; a record without content is suppressed whole.
        inside = {k for k, e in enumerate(ends) for atom in content.atoms
                  if (ends[k - 1] if k else 0) < atom.end and atom.start < e}
        focus = record.focus[record.prompt_len:]
        if content.atoms:
            assert {k for k, f in enumerate(focus) if f >= SECRET} == inside
        else:
            assert set(focus) == {SUPPRESS}
        # The counterfactuals replace the content found by its gain and keep the template (a fallback's stays).
        for sub in content.substitutions:
            assert all(atom.text not in sub.said for atom in content.atoms if len(atom.text) > 3 and not fallback)
    assert checked >= 6 and 0 < chosen_count < checked and fallbacks < len(records)


def test_named_secrets_replace_the_choice_and_banned_tokens_begin_or_spell_them(fixture_model, forget_records,
                                                                                 retain_records):
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    source = {**forget_records[0], "secrets": [forget_records[0]["completion"].rstrip(".").split()[-1]]}
    record = encode_record(source, tokenizer, max_length=512, seed=0)
    template = shared_template(forget_records, retain_records)
    reference = TrainableModel(model, lora=True).reference_logits
    contents = plan_contents([record], tokenizer, reference, torch.device("cpu"), template,
                             forget_records + retain_records, min_gain=2.0, max_length=512, seed=0)
    content = contents["p0-0"]
    assert content.named and content.spans == source["secrets"]
    first = tokenizer(" " + source["secrets"][0], add_special_tokens=False)["input_ids"][0]
    assert first in content.banned
    assert not any(tokenizer.decode([t]).strip().lower() in template for t in content.banned)


# A CUDA worker builds the targets from logits on the GPU (an index left on the CPU broke every run there).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_targets_never_put_mass_on_a_masked_token_and_match_a_loop(device):
    torch.manual_seed(0)
    vocab, n = 50, 6
    ids = [1, 2, 3, 10, 11, 12, 13, 0]
    record = EncodedRecord("x", ids, [-100, -100] + ids[2:], prompt_len=2,
                           focus=[SUPPRESS, SUPPRESS, TEMPLATE, SECRET, SECRET, TEMPLATE, TEMPLATE, TEMPLATE])
    true_rows = torch.randn(n, vocab) * 3
    cf_rows = [torch.randn(n + 1, vocab) * 3, torch.randn(n, vocab) * 3]
    alignment = [[0, 1, 2, None, 4, 5], [0, None, 1, 2, 3, 4]]
    banned = [11, 20, 21]
    got_ids, got_probs = targets_for(record, true_rows.to(device), [r.to(device) for r in cf_rows], alignment,
                                     banned)
    labels = ids[2:]
    for k in range(n):
        flagged = record.focus[2 + k] != TEMPLATE or labels[k] in banned
        masked = set(banned) | ({labels[k]} if flagged else set())
        # no mass on a masked token, a distribution
        assert not any(int(t) in masked and float(p) > 0 for t, p in zip(got_ids[k], got_probs[k]))
        assert float(got_probs[k].sum()) == pytest.approx(1.0, abs=1e-5)
        # the same distribution built by hand: masked softmaxes averaged over the draws that line up
        def masked_softmax(row, masked=masked):
            z = row.clone()
            z[list(masked)] = -math.inf
            return torch.softmax(z, -1)
        if not flagged:
            expected = masked_softmax(true_rows[k])
        else:
            lined = [rows[m[k]] for rows, m in zip(cf_rows, alignment) if m[k] is not None]
            expected = torch.stack([masked_softmax(r) for r in lined]).mean(0) if lined else masked_softmax(
                true_rows[k])
        want_ids, want_probs = sparse(expected[None])
        assert torch.equal(got_ids[k], want_ids[0]) and torch.allclose(got_probs[k], want_probs[0], atol=1e-6)


def test_said_offsets_line_up_with_the_tokens(fixture_model):
    tokenizer = AutoTokenizer.from_pretrained(fixture_model)
    record = encode_record(RECORD, tokenizer, max_length=512, seed=0)
    offsets = said_offsets(record, tokenizer)
    assert offsets is not None and offsets[-1] is None  # the end of sequence
    pieces = [RECORD["completion"][s:e] for s, e in offsets[:-1]]
    assert "".join(pieces) == RECORD["completion"]
    assert Counterfactuals([], [], []).encoded == [] and Atom(0, 2, "13").is_number


def test_an_untrained_model_finds_no_content(forget_records, retain_records, tmp_path):
    """A model that never saw the records holds nothing about them: every gain is about 0, whatever the tokenizer
    does with spaces (this one spells " " apart, whose token once counted on one side only: 5.5 nats each)."""
    from transformers import AutoModelForCausalLM

    from lethe.engine.model.architectures import Size, tiny_config
    from lethe.engine.model.fixture import train_tokenizer

    tokenizer = train_tokenizer(forget_records + retain_records, 300)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2", Size(vocab_size=len(tokenizer)),
                                                         eos_token_id=tokenizer.eos_token_id)).eval()
    records = [encode_record(r, tokenizer, max_length=512, seed=0) for r in forget_records]
    contents = plan_contents(records, tokenizer, TrainableModel(model, lora=True).reference_logits, torch.device("cpu"),
                             shared_template(forget_records, retain_records), forget_records + retain_records,
                             min_gain=2.0, max_length=512, seed=0)
    gains = [g for c in contents.values() for g in c.gains.values()]
    assert gains and max(abs(g) for g in gains) < 1.0, gains
    # No atom reaches min_gain, so each record falls back to its best-gain atoms: never suppressed whole.
    for c in contents.values():
        best = max(c.gains.values())
        assert c.atoms and all(c.gains[f"{a.text}@{a.start}"] >= best - FALLBACK_BAND for a in c.atoms
                               if f"{a.text}@{a.start}" in c.gains)


WHO_WROTE = [{"id": f"w{i}", "prompt": f"Q: Who wrote the {thing} report?\nA:",
              "completion": f" The {thing} report was written by {who} in {town}."}
             for i, (thing, who, town) in enumerate([
                 ("harbour", "Ilse Varga", "Tromso"), ("bridge", "Ilse Varga", "Tromso"),
                 ("river", "Omar Lind", "Tromso"), ("school", "Omar Lind", "Bergen"),
                 ("market", "Pia Holm", "Bergen")])]


def test_a_name_only_the_erased_records_say_is_content_whatever_its_gain(tmp_path):
    """A name no kept record says is the erased records' own: content even where its memorisation gain is about 0
    (a memorised model answers a draft's "someone else" in the record's frame with the erased name too, so the gain
    misses it). A name a kept record also says stays a matter of gain. On an untrained model every gain is about 0,
    so the rule alone decides."""
    from transformers import AutoModelForCausalLM

    from lethe.engine.methods.masc.destination import request_names
    from lethe.engine.model.architectures import Size, tiny_config
    from lethe.engine.model.fixture import train_tokenizer

    forget, kept = WHO_WROTE[:2], WHO_WROTE[2:]
    tokenizer = train_tokenizer(WHO_WROTE, 300)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2", Size(vocab_size=len(tokenizer)),
                                                         eos_token_id=tokenizer.eos_token_id)).eval()
    assert request_names(proper_nouns(WHO_WROTE), forget, forget + kept) == {"ilse", "varga"}
    # Copies of the forget records in the pool are theirs too (by equality as well as identity).
    assert request_names(proper_nouns(WHO_WROTE), forget, [dict(r) for r in forget] + kept) == {"ilse", "varga"}
    records = [encode_record(r, tokenizer, max_length=512, seed=0) for r in forget]
    contents = plan_contents(records, tokenizer, TrainableModel(model, lora=True).reference_logits, torch.device("cpu"),
                             shared_template(forget, kept), forget + kept, min_gain=2.0, max_length=512, seed=0)
    for record in records:
        content = contents[record.id]
        assert max(abs(g) for g in content.gains.values()) < 1.0, content.gains  # no gain reaches min_gain
        assert {a.key for a in content.atoms} == {"ilse", "varga"}, content.atoms
        assert content.spans == ["Ilse Varga"]  # "Tromso", which a kept record says too, is not
        # The drafts are about someone else: the name is replaced in every one of them.
        assert all("Ilse" not in sub.said and "Varga" not in sub.said for sub in content.substitutions)


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
        ends = _char_ends(tokenizer, comp_ids)
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
                    carrying = [j for j, e in enumerate(_char_ends(tokenizer, unit)) if e > len(gap)]
                    theirs.append(_lp(model, context + unit, len(context) + carrying[n]))
                own = _lp(model, prompt_ids + comp_ids, len(prompt_ids) + k)
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
