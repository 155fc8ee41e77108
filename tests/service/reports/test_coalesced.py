"""A request's slice of a coalesced run's documents (issue 28): its own records under their own ids, the other
members' gone, aggregates kept."""
from lethe.service.reports.coalesced import member_slice

A, B = "job_a/", "job_b/"


def test_a_slice_keeps_its_own_records_under_their_own_ids_and_drops_the_others():
    document = {
        "final_violation_rate": 0.1,
        "per_record": [{"id": A + "r1", "v": 0.0}, {"id": B + "r1", "v": 1.0}, {"id": A + "r2", "v": 0.5}],
        "erasure": {"failing_ids": [B + "r1", A + "r2"], "applied": True},
        "forget_verbatim": {"exact_match": {"value": 0.5, "per_record": {A + "r1": 0.0, B + "r1": 1.0}}},
        "truth": {A + "r1#0": 0.2, B + "r1#0": 0.9},
        "summary": "job_b/r1 fails",  # free text is not a record name: left as it is
        "nested": [[A + "r1", B + "r1"], {"id": "not-a-member", "x": 1}],
    }
    assert member_slice(document, A, [A, B]) == {
        "final_violation_rate": 0.1,
        "per_record": [{"id": "r1", "v": 0.0}, {"id": "r2", "v": 0.5}],
        "erasure": {"failing_ids": ["r2"], "applied": True},
        "forget_verbatim": {"exact_match": {"value": 0.5, "per_record": {"r1": 0.0}}},
        "truth": {"r1#0": 0.2},
        "summary": "job_b/r1 fails",
        "nested": [["r1"], {"id": "not-a-member", "x": 1}],
    }
    assert member_slice(document, B, [A, B])["per_record"] == [{"id": "r1", "v": 1.0}]
    # Every record is in exactly one slice.
    ids = [r["id"] for p in (A, B) for r in member_slice(document, p, [A, B])["per_record"]]
    assert sorted(ids) == ["r1", "r1", "r2"]
