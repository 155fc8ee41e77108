"""`python -m bench.bench_chain --anchor`: which requests of a chain anchor their retain term to the root."""
from bench.bench_chain import anchored_to_root


def test_request_1_starts_from_the_root_so_nothing_anchors_it():
    assert not any(anchored_to_root(1, anchor) for anchor in ("root", "start", "turns"))


def test_each_reference_over_ten_requests():
    requests = range(2, 11)
    assert all(anchored_to_root(n, "root") for n in requests)
    assert not any(anchored_to_root(n, "start") for n in requests)
    assert [n for n in requests if anchored_to_root(n, "turns")] == [2, 4, 6, 8, 10]
