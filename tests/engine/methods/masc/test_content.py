"""Content and destinations (issue 24): counterfactual substitution, memorisation gain against a brute-force
computation, the banned tokens, and targets that never put mass on a masked token."""
import math

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


def brute_logprob(model, ids: list[int], position: int) -> float:
    """log p(ids[position] | ids[:position]), one forward pass of its own: the brute force."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:position]])).logits[0, -1]
    return float(torch.log_softmax(logits.float(), -1)[ids[position]])


def char_ends(tokenizer, ids: list[int]) -> list[int]:
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
        ends = char_ends(tokenizer, unit)
        carrying = [k for k, e in enumerate(ends) if e > len(gap)]
        return sum(brute_logprob(model, context + unit, len(context) + k) for k in carrying)

    checked = chosen_count = fallbacks = 0
    frequent = frequent_template(forget_records + retain_records)
    for record in records:
        source, content = record.source, contents[record.id]
        completion = source["completion"]
        comp_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        ends = char_ends(tokenizer, comp_ids)
        prompt_ids = tokenizer(source["prompt"])["input_ids"]
        gains: dict[str, float] = {}
        atoms = candidate_atoms(source, template) or candidate_atoms(source, frequent & template)
        for atom in atoms:
            if atom.key in gains:
                continue  # a recurring word is decided once, where it first occurs
            mine = [k for k, e in enumerate(ends) if (ends[k - 1] if k else 0) < atom.end and atom.start < e]
            own = sum(brute_logprob(model, prompt_ids + comp_ids, len(prompt_ids) + k) for k in mine)
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
