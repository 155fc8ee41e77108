"""`python -m bench.bench_forgetting`'s flags: `--successor` (a model's second request, issue 28) is one of them, and a
misspelt flag stops before any training."""
import pytest

from bench.bench_forgetting import FORGET, HOLDOUT, PRIOR, RETAIN, check_arguments


def test_the_successor_flag_is_accepted_and_a_misspelt_one_stops():
    check_arguments(["--customers-only", "--successor", "--archs", "gpt2", "--seeds", "1"])
    with pytest.raises(SystemExit, match="--successr"):
        check_arguments(["--successr"])


def test_the_earlier_request_erases_a_kept_customer_not_one_the_request_or_the_holdout_names():
    assert PRIOR in RETAIN and PRIOR not in FORGET and PRIOR not in HOLDOUT


def test_params_reach_every_default_row_and_keep_each_seed(monkeypatch):
    from bench.bench_forgetting import masc_runs
    monkeypatch.setattr("sys.argv", ["x", "--default-only", "--params", '{"lora": false, "seed": 9}'])
    check_arguments(["--default-only", "--params", '{"lora": false}'])
    rows = masc_runs(2)
    assert [r[2] for r in rows] == [{"lora": False, "seed": 0}, {"lora": False, "seed": 1}] * 2
