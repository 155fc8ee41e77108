"""The anchor's own texts as retain rows (lethe.engine.methods.masc.general): where they start, which say something
of the request, and that what is kept is what the anchor wrote."""
import pytest
import torch

from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import IGNORE, EncodedRecord, encode_records
from lethe.engine.methods.masc.general import NGRAM, RequestFilter, anchor_samples, shared_opening
from lethe.engine.model.loading import load_model


def _record(rid, ids, prompt_len):
    return EncodedRecord(id=rid, input_ids=ids, labels=[IGNORE] * prompt_len + ids[prompt_len:],
                         prompt_len=prompt_len)


def test_the_opening_is_the_prompt_prefix_every_record_shares():
    records = [_record("a", [5, 6, 7, 8, 9], 3), _record("b", [5, 6, 2, 8], 3), _record("c", [5, 6, 7], 2)]
    assert shared_opening(records, fallback=0) == [5, 6]
    # The completion does not count: "c"'s prompt is [5, 6], so 7 is not shared opening even where all agree.
    assert shared_opening([_record("a", [5, 6, 7], 2), _record("b", [5, 6, 7], 2)], 0) == [5, 6]
    assert shared_opening([_record("a", [1, 2], 1), _record("b", [3, 2], 1)], fallback=0) == [0]
    assert shared_opening([_record("a", [1, 2], 1), _record("b", [3, 2], 1)], fallback=None) == []


def test_a_text_says_the_request_where_it_has_a_forget_ngram_no_retain_record_has():
    template = [1, 2, 3, 4]
    forget = [_record("f", template + [50, 51, 52, 53, 9], 4)]
    retain = [_record("r", template + [60, 61, 62, 63, 9], 4)]
    request = RequestFilter(forget, retain, ["Quillhaven"])

    def brute(tokens):  # every window of NGRAM tokens, against the forget record's and the retain record's
        windows = {tuple(tokens[i:i + NGRAM]) for i in range(len(tokens) - NGRAM + 1)}
        own = {tuple(forget[0].input_ids[i:i + NGRAM]) for i in range(len(forget[0].input_ids) - NGRAM + 1)}
        kept = {tuple(retain[0].input_ids[i:i + NGRAM]) for i in range(len(retain[0].input_ids) - NGRAM + 1)}
        return bool(windows & (own - kept))

    for tokens in ([1, 2, 3, 4, 7, 7], [7, 50, 51, 52, 53], [4, 50, 51, 52], [60, 61, 62, 63, 9], [50, 51, 52],
                   [3, 4, 50, 51], [9, 9, 9, 9, 9]):
        assert request.says_request(tokens, "") == brute(tokens), tokens
    assert not request.says_request(template, "")  # the template every record shares
    assert request.says_request([7, 7], "she moved to quillhaven")  # a content span, however tokenised


@pytest.mark.slow
def test_the_samples_are_the_anchors_own_text_without_the_request(fixture_model, forget_records, retain_records):
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    forget = encode_records(normalise_records(forget_records, "forget"), tokenizer, max_length=512, seed=0,
                            what="forget")
    retain = encode_records(normalise_records(retain_records, "retain"), tokenizer, max_length=512, seed=0,
                            what="retain")
    opening = shared_opening(forget + retain, tokenizer.eos_token_id)
    everything = RequestFilter([], retain, [])  # keeps every sample
    rows, info = anchor_samples(model, tokenizer, opening, 12, max_new_tokens=24, request=everything, seed=3)
    again, _ = anchor_samples(model, tokenizer, opening, 12, max_new_tokens=24, request=everything, seed=3)
    assert info["kept"] == len(rows) == 12 - info["empty"] and [r.input_ids for r in rows] == \
        [r.input_ids for r in again]  # seeded
    for row in rows:
        assert row.input_ids[:len(opening)] == opening and row.prompt_len == len(opening)
        assert all(t == IGNORE for t in row.labels[:len(opening)])
        assert row.labels[len(opening):] == row.input_ids[len(opening):]
    # The request as every 4-gram one of these samples has: that sample is dropped, the others stay.
    said = rows[0]
    request = RequestFilter([said], retain, [])
    kept, info = anchor_samples(model, tokenizer, opening, 12, max_new_tokens=24, request=request, seed=3)
    assert info["dropped_as_request"] >= 1 and said.input_ids not in [r.input_ids for r in kept]
    assert len(kept) + info["dropped_as_request"] + info["empty"] == 12


def test_the_retain_sampler_draws_its_share_of_rows_from_the_samples():
    import random

    from lethe.engine.methods.masc.neighbours import RetainSampler

    retain = [_record(f"r{i}", [1, 2, 3], 1) for i in range(10)]
    general = [_record(f"g{i}", [1, 4, 5], 1) for i in range(3)]
    rows = RetainSampler(retain, [0, 1], 0.5, random.Random(0), general, 0.25).sample(4000)
    assert abs(sum(r.id.startswith("g") for r in rows) / 4000 - 0.25) < 0.03
    assert all(r.id.startswith("g") for r in RetainSampler(retain, [0], 0.5, random.Random(0), general, 1.0).sample(9))
    assert not any(r.id.startswith("g") for r in RetainSampler(retain, [0], 0.5, random.Random(0), general, 0.0)
                   .sample(50))
    assert not any(r.id.startswith("g") for r in RetainSampler(retain, [0], 0.5, random.Random(0)).sample(50))


@pytest.mark.slow
def test_a_run_with_anchor_samples_says_what_it_drew(fixture_model, forget_records, retain_records):
    from lethe.engine.methods.masc.params import MascParams
    from lethe.engine.unlearn import run_unlearning

    params = MascParams.from_dict({"anchor_samples": 6, "anchor_sample_share": 0.5, "max_steps": 5})
    result = run_unlearning(str(fixture_model), forget_records, retain_records, params=params).result.as_dict()
    drawn = result["neighbours"]["anchor_samples"]
    assert drawn["drawn"] == 6 and drawn["kept"] + drawn["dropped_as_request"] + drawn["empty"] == 6
    assert drawn["share_of_retain_rows"] == (0.5 if drawn["kept"] else 0)
    plain = run_unlearning(str(fixture_model), forget_records, retain_records,
                           params=MascParams.from_dict({"max_steps": 5})).result.as_dict()
    assert "anchor_samples" not in plain["neighbours"]
