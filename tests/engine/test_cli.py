"""The engine's CLI: a real run in a subprocess, and bad input refused in one line with OUT untouched."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lethe.engine.__main__ import main
from tests.conftest import write_jsonl

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "lethe.engine", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)


def test_unlearn_cli_writes_model_and_result(fixture_model, forget_records, retain_records, tmp_path):
    forget = write_jsonl(tmp_path / "forget.jsonl", forget_records)
    retain = write_jsonl(tmp_path / "retain.jsonl", retain_records)
    out = tmp_path / "out"
    done = run_cli("unlearn", "--model", str(fixture_model), "--forget", str(forget), "--retain", str(retain),
                   "--out", str(out), "--lr", "1e-3", "--max-steps", "1000", "--check-every", "5")
    assert done.returncode == 0, done.stderr
    assert "stop_reason=alpha" in done.stdout
    assert "step" in done.stderr  # the progress bar
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "alpha" and result["params"]["check_every"] == 5
    assert (out / "model" / "config.json").exists() and (out / "model" / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forget.jsonl", "out", "retain.jsonl"]  # no staging left


def test_unlearn_cli_runs_a_baseline(fixture_model, forget_records, retain_records, tmp_path, capsys):
    forget = write_jsonl(tmp_path / "forget.jsonl", forget_records)
    retain = write_jsonl(tmp_path / "retain.jsonl", retain_records)
    code = main(["unlearn", "--model", str(fixture_model), "--forget", str(forget), "--retain", str(retain),
                 "--out", str(tmp_path / "out"), "--method", "npo", "--epochs", "1", "--full", "--no-progress"])
    assert code == 0 and "stop_reason=budget" in capsys.readouterr().out
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["method"] == "npo" and result["params"]["lora"] is False and result["params"]["beta"] == 0.1
    assert main(["unlearn", "--model", str(fixture_model), "--forget", str(forget), "--out", str(tmp_path / "o2"),
                 "--method", "npo", "--k", "3"]) == 2
    assert "unknown parameter 'k' for method npo" in capsys.readouterr().err


def test_fixture_cli_builds_a_loadable_model(forget_records, tmp_path):
    records = write_jsonl(tmp_path / "records.jsonl", forget_records)
    done = run_cli("fixture", "--records", str(records), "--out", str(tmp_path / "fx"), "--epochs", "2",
                   "--hidden-size", "32", "--layers", "1", "--vocab-size", "300", "--seed", "1")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["epochs"] == 2 and summary["records"] == len(forget_records)
    assert (tmp_path / "fx" / "tokenizer.json").exists() and (tmp_path / "fx" / "config.json").exists()


def test_a_gpt2_model_built_by_the_cli_is_unlearned_with_no_flags(forget_records, tmp_path):
    records = write_jsonl(tmp_path / "records.jsonl", forget_records)
    built = run_cli("fixture", "--records", str(records), "--out", str(tmp_path / "fx"), "--arch", "gpt2",
                    "--hidden-size", "64", "--layers", "2", "--vocab-size", "300", "--epochs", "300")
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["memorised_fraction"] == 1.0
    assert json.loads((tmp_path / "fx" / "config.json").read_text())["model_type"] == "gpt2"
    forget = write_jsonl(tmp_path / "forget.jsonl", forget_records[:5])
    retain = write_jsonl(tmp_path / "retain.jsonl", forget_records[5:])
    done = run_cli("unlearn", "--model", str(tmp_path / "fx"), "--forget", str(forget), "--retain", str(retain),
                   "--out", str(tmp_path / "out"), "--no-progress")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["stop_reason"] == "alpha" and result["erasure"]["failing_ids"] == []
    # with retain records and room, no flags means whitened full fine-tuning of every projection (lora "auto")
    assert result["params"]["lora"] is False and result["params"]["whiten_updates"] is True
    assert result["lora"]["mode"] == "full"
    assert set(result["lora"]["whitened"]["modules"]) == {"c_attn", "c_proj", "c_fc"}
    bad = run_cli("fixture", "--records", str(records), "--out", str(tmp_path / "fx2"), "--arch", "gpt-17")
    assert bad.returncode == 2 and "arch 'gpt-17'" in bad.stderr and not (tmp_path / "fx2").exists()
    # --base fine-tunes a model (here the one just built, which needs no epoch more) and keeps its kind
    tuned = run_cli("fixture", "--records", str(records), "--out", str(tmp_path / "fx3"),
                    "--base", str(tmp_path / "fx"), "--epochs", "3", "--lr", "1e-5")
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["epochs"] == 1 and json.loads(tuned.stdout)["memorised_fraction"] == 1.0
    assert json.loads((tmp_path / "fx3" / "config.json").read_text())["model_type"] == "gpt2"


@pytest.mark.parametrize("make_args,message", [
    (lambda d: ["--forget", str(write_jsonl(d / "f.jsonl", []))], "forget set is empty"),
    (lambda d: ["--forget", str(write_jsonl(d / "f.jsonl", [{"id": "q9", "prompt": "Q"}]))], "'q9'"),
    (lambda d: ["--forget", str(write_jsonl(d / "f.jsonl", [{"prompt": "Q", "completion": ""}]))], "empty completion"),
    (lambda d: ["--forget", str(d / "f.jsonl"), "--preset", "nope"], "unknown preset 'nope'"),
    (lambda d: ["--forget", str(d / "f.jsonl"), "--alpha", "1.5"], "alpha"),
    (lambda d: ["--forget", str(d / "f.jsonl"), "--rho", "0"], "rho"),
    (lambda d: ["--forget", str(d / "f.jsonl"), "--k", "0"], "k"),
    (lambda d: ["--forget", str(d / "f.jsonl"), "--gamma", "1"], "unrecognized arguments: --gamma"),
    (lambda d: ["--forget", str(d / "missing.jsonl")], "no such file"),
    (lambda d: ["--forget", str(d / "f.jsonl"), "--device", "tpu"], "device 'tpu'"),
    (lambda d: ["--forget", str(d / "f.jsonl"), "--lora-targets", "nonexistent_proj"], "no modules named"),
])
def test_bad_input_exits_nonzero_with_one_line_and_leaves_nothing(make_args, message, fixture_model,
                                                                  forget_records, tmp_path, capsys):
    write_jsonl(tmp_path / "f.jsonl", forget_records)
    args = make_args(tmp_path)
    out = tmp_path / "out"
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(main(["unlearn", "--model", str(fixture_model), *args, "--out", str(out), "--no-progress"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-written


def test_unknown_model_directory_is_refused(forget_records, tmp_path, capsys):
    forget = write_jsonl(tmp_path / "f.jsonl", forget_records)
    code = main(["unlearn", "--model", str(tmp_path / "nomodel"), "--forget", str(forget),
                 "--out", str(tmp_path / "o")])
    assert code == 2 and "no such directory" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_refuses_a_non_empty_out(fixture_model, forget_records, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    forget = write_jsonl(tmp_path / "f.jsonl", forget_records)
    assert main(["unlearn", "--model", str(fixture_model), "--forget", str(forget),
                 "--out", str(tmp_path / "out")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_connectivity_cli_writes_the_curve_and_the_ensemble(fixture_model, forget_records, retain_records, tmp_path,
                                                            capsys):
    forget = write_jsonl(tmp_path / "forget.jsonl", forget_records)
    retain = write_jsonl(tmp_path / "retain.jsonl", retain_records)
    assert main(["unlearn", "--model", str(fixture_model), "--forget", str(forget), "--out", str(tmp_path / "b"),
                 "--method", "ga", "--epochs", "1", "--lr", "1e-3", "--no-progress"]) == 0
    capsys.readouterr()
    code = main(["connectivity", "--a", str(fixture_model), "--b", str(tmp_path / "b" / "model"),
                 "--forget", str(forget),
                 "--retain", str(retain), "--points", "3", "--out", str(tmp_path / "curve.json"),
                 "--ensemble-out", str(tmp_path / "ensemble")])
    assert code == 0, capsys.readouterr().err
    assert "mcu_holds=" in capsys.readouterr().out
    result = json.loads((tmp_path / "curve.json").read_text())
    assert [p["t"] for p in result["points"]] == [0.0, 0.5, 1.0] and result["barriers"]["retain"]["value"] is not None
    assert (tmp_path / "ensemble" / "config.json").exists()
    assert main(["connectivity", "--a", str(fixture_model), "--b", str(fixture_model), "--points", "two",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "points='two': expected int" in capsys.readouterr().err
