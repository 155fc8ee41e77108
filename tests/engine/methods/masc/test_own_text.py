"""Own text (issue 28): the start model's samples beside the retain records, less those about the forget records."""
import random
import types

import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.data.records import IGNORE, EncodedRecord, encode_record
from lethe.engine.methods.masc.own_text import (
    OwnTextRows,
    forget_only_words,
    own_text,
    shared_opening,
    words,
)
from lethe.engine.model.loading import load_model


def test_forget_only_words_are_the_forget_records_words_no_retain_record_or_function_word_says():
    forget = [{"prompt": "Where was Kalomi born?", "completion": "Kalomi was born in Oslo, 1991."}]
    retain = [{"prompt": "Where was Renzu born?", "completion": "Renzu was born in Lima."}]
    # By hand: forget's words {where, was, kalomi, born, in, oslo, 1991} less retain's and the function words.
    assert forget_only_words(forget, retain) == {"kalomi", "oslo", "1991"}
    assert words(["Hsiao Yun-Hwa's_book"]) == {"hsiao", "yun", "hwa", "s", "book"}


def record(ids: list[int], prompt_len: int) -> EncodedRecord:
    return EncodedRecord("r", ids, [IGNORE] * prompt_len + ids[prompt_len:], prompt_len)


def test_the_shared_opening_is_the_common_prompt_prefix_capped_or_the_start_of_sequence():
    tok = types.SimpleNamespace(bos_token_id=None, eos_token_id=0)
    assert shared_opening([record([5, 6, 7, 9], 3), record([5, 6, 8, 9], 3)], tok) == [5, 6]
    assert shared_opening([record(list(range(1, 20)), 12)] * 2, tok, cap=4) == [1, 2, 3, 4]
    assert shared_opening([record([5, 9], 1), record([6, 9], 1)], tok) == [0]  # nothing shared: EOS (GPT-2's way)
    assert shared_opening([record([5, 9], 1), record([6, 9], 1)], types.SimpleNamespace(bos_token_id=3,
                                                                                          eos_token_id=0)) == [3]


def test_a_retain_batch_draws_its_share_of_own_text_rows():
    own = [record([1, 2], 1) for _ in range(3)]
    retain = [record([4, 5], 1) for _ in range(4000)]
    mixed = OwnTextRows(own, 0.25, random.Random(0)).mix(retain)
    drawn = sum(any(r is o for o in own) for r in mixed)
    assert len(mixed) == len(retain) and abs(drawn - 1000) < 100  # binomial(4000, 0.25): sd 27
    assert OwnTextRows(own, 0.0, random.Random(0)).mix(retain) == retain
    assert OwnTextRows([], 0.5, random.Random(0)).mix(retain) == retain


@pytest.mark.slow
def test_the_model_writes_own_text_and_no_kept_sample_is_about_a_forget_record(fixture_model, forget_records,
                                                                               retain_records):
    torch.manual_seed(0)
    model, _ = load_model(fixture_model, torch.device("cpu"))
    tokenizer = AutoTokenizer.from_pretrained(fixture_model)
    forget = [encode_record(r, tokenizer, max_length=64, seed=0) for r in forget_records]
    retain = [encode_record(r, tokenizer, max_length=64, seed=0) for r in retain_records]
    rows, summary = own_text(model, tokenizer, forget, retain, samples=48, max_new_tokens=24, seed=0)
    banned = forget_only_words(forget_records, retain_records)
    assert banned  # the forget people have names no one else has
    # The fixture model says its forget people's facts too: some samples are about them, and none of those is kept.
    assert summary["about_forget_records"] > 0 and summary["kept"] == len(rows) > 0
    assert summary["asked"] == 48 == summary["kept"] + summary["about_forget_records"] + summary["too_short"]
    opening = shared_opening(retain, tokenizer)
    assert summary["opening_tokens"] == len(opening) > 1  # "Question:" and what every retain prompt starts with
    for row in rows:
        assert row.input_ids[:len(opening)] == opening and row.prompt_len == len(opening)
        assert row.labels == [IGNORE] * len(opening) + row.input_ids[len(opening):]
        assert not words([tokenizer.decode(row.input_ids[len(opening):], skip_special_tokens=True)]) & banned
    again, _ = own_text(model, tokenizer, forget, retain, samples=48, max_new_tokens=24, seed=0)
    assert [r.input_ids for r in again] == [r.input_ids for r in rows]  # seeded


@pytest.mark.slow
def test_a_run_with_own_text_reports_what_it_kept(fixture_model, forget_records, retain_records):
    from lethe.engine.methods.masc.params import MascParams
    from lethe.engine.unlearn import run_unlearning

    params = MascParams.from_dict({"own_text_samples": 16, "own_text_tokens": 16, "max_steps": 5, "lr": 1e-3})
    r = run_unlearning(str(fixture_model), forget_records, retain_records, params=params).result.as_dict()
    assert r["own_text"]["asked"] == 16 and r["own_text"]["kept"] > 0 and r["own_text"]["share_of_retain_rows"] == 0.25
    alone = run_unlearning(str(fixture_model), forget_records, [],
                           params=MascParams.from_dict({"own_text_samples": 16, "max_steps": 5, "lr": 1e-3}))
    assert alone.result.as_dict()["own_text"] is None  # no retain records: nothing to keep it beside
