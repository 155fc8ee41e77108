"""`make bench-gpu` in its reduced mode (issue 15): the same script as on a GPU, on a tiny model of four synthetic
people (TOFU's file lies outside the repository) for a few steps, so that the GPU run cannot break unseen. Its
figures are not results."""
import json

import pytest

from bench.bench_gpu import METHODS, main

pytestmark = pytest.mark.slow


def test_the_gpu_benchmark_runs_reduced_on_cpu(tmp_path, capsys):
    rows = main(["--reduced", "--synthetic", "--out", str(tmp_path)])
    assert [r["method"] for r in rows] == ["retain reference", "base (before unlearning)"] + [m[0] for m in METHODS]
    report = json.loads((tmp_path / "gpu-reduced.json").read_text())
    assert report["command"] == "python -m bench.bench_gpu --reduced --synthetic" and report["rows"] == rows
    for row in rows[2:]:
        assert row["steps"] > 0 and row["seconds"] > 0 and row["peak_memory_mib"] > 0 and row["estimate_mib"] > 0
        assert row["mfu"] is None and row["mfu_basis"].startswith("CPU")  # no dense peak to divide by on CPU
        assert 0 <= row["forget_quality"] <= 1 and 0 <= row["model_utility"] <= 1
    assert rows[2]["stop_reason"] == "max_steps" and rows[4]["stop_reason"] == "budget"
    printed = capsys.readouterr().out
    assert "| masc (tofu-llama2) |" in printed and "| simnpo |" in printed
