"""Long documents (issue 14): a text longer than the context becomes non-overlapping windows of near-equal length,
each with its own seeded continuation split, trained and judged as records, and reported per document."""
import pytest
from transformers import AutoTokenizer

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.documents import DOCUMENT, TOKENS, document_summary, split_documents
from lethe.engine.data.records import IGNORE, encode_record
from lethe.engine.methods import params_for
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

LONG = " ".join(f"Kalo wrote letter {i} to the harbour master of Riga in the spring." for i in range(40))


@pytest.fixture(scope="module")
def tokenizer(fixture_model):
    return AutoTokenizer.from_pretrained(fixture_model)


def brute_windows(n: int, size: int) -> list[tuple[int, int]]:
    """The fewest windows of at most `size` tokens that cover n tokens, as equal as whole tokens allow."""
    count = -(-n // size)
    base, extra = divmod(n, count)
    lengths = [base + 1] * extra + [base] * (count - extra)
    return [(sum(lengths[:k]), sum(lengths[:k + 1])) for k in range(count)]


@pytest.mark.parametrize("max_length", [40, 64, 100])
def test_a_long_text_becomes_windows_that_cover_it_once(tokenizer, max_length):
    records = normalise_records([{"id": "doc", "text": LONG}, {"id": "short", "text": "A short note."},
                                 {"id": "qa", "prompt": "Q: ", "completion": "A."}], "forget")
    out = split_documents(records, tokenizer, max_length, "forget")
    windows = [r for r in out if r.get(DOCUMENT) == "doc"]
    assert out[-2:] == records[1:]  # what fits stays as it is
    body = tokenizer(LONG, add_special_tokens=False)["input_ids"]
    special = len(tokenizer(LONG, add_special_tokens=True)["input_ids"]) - len(body)
    assert [w["id"] for w in windows] == [f"doc#{k + 1}" for k in range(len(windows))] and len(windows) > 1
    assert all(len(w[TOKENS]) <= max_length for w in windows)
    chunks = [w[TOKENS][special:] if special else w[TOKENS] for w in windows]
    assert [t for c in chunks for t in c] == body  # every token once, in order: no gap, no overlap
    lengths = [len(c) for c in chunks]
    assert sorted(lengths, reverse=True) == [b - a for a, b in brute_windows(len(body), max_length - special)]


def test_each_window_is_scored_with_its_own_seeded_split(tokenizer):
    windows = split_documents(normalise_records([{"id": "doc", "text": LONG}], "forget"), tokenizer, 80, "forget")
    encoded = [encode_record(w, tokenizer, max_length=80, seed=3) for w in windows]
    again = [encode_record(w, tokenizer, max_length=80, seed=3) for w in windows]
    assert [e.labels for e in encoded] == [e.labels for e in again]  # deterministic under the seed
    assert all(e.input_ids == w[TOKENS] and e.truncated_tokens == 0 for e, w in zip(encoded, windows))
    assert all(e.labels[:e.prompt_len] == [IGNORE] * e.prompt_len and e.active_tokens > 0 for e in encoded)
    assert len({e.prompt_len / len(e.input_ids) for e in encoded}) > 1  # the split differs by window


def test_a_window_id_that_would_collide_is_refused(tokenizer):
    records = normalise_records([{"id": "doc", "text": LONG}, {"id": "doc#2", "text": "x y z"}], "forget")
    with pytest.raises(EngineInputError, match="'doc#2'") as caught:
        split_documents(records, tokenizer, 64, "forget")
    assert caught.value.field == "forget"


def test_the_summary_says_per_document_whether_every_window_meets_the_condition():
    sources = [{"id": "a#1", DOCUMENT: "a"}, {"id": "a#2", DOCUMENT: "a"}, {"id": "b"}]
    rows = [{"id": "a#1", "violation": 0.2, "meets_condition": True, "reproduced": False},
            {"id": "a#2", "violation": 0.4, "meets_condition": False, "reproduced": True},
            {"id": "b", "violation": 0.1, "meets_condition": True, "reproduced": False}]
    [doc] = document_summary(sources, rows)
    assert doc == {"id": "a", "windows": ["a#1", "a#2"], "violation": pytest.approx(0.3),
                   "reproduced_windows": ["a#2"], "meets_condition": False}
    assert document_summary(sources, [{**r, "meets_condition": True} for r in rows])[0]["meets_condition"] is True


def test_a_document_longer_than_the_context_is_unlearned_window_by_window(fixture_model, retain_records):
    forget = [{"id": "doc", "text": LONG}, {"id": "qa", "prompt": "Question: Who? ", "completion": "Kalo."}]
    outcome = run_unlearning(str(fixture_model), forget, retain_records[:8],
                             params=params_for("masc", {"max_length": 64, "max_steps": 2, "lr": 1e-3}))
    r = outcome.result
    ids = [p["id"] for p in r.measured.per_record]
    assert ids[-1] == "qa" and len(ids) > 2 and all(i.startswith("doc#") for i in ids[:-1])
    [doc] = r.documents
    assert doc["windows"] == ids[:-1] and isinstance(doc["meets_condition"], bool)
    assert r.as_dict()["documents"] == r.documents and r.as_dict()["truncated"] == []
