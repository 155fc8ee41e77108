"""Full fine-tuning with FSDP (issue 15): two processes on CPU with gloo shard the model, its gradients, AdamW's
state and the frozen copy, and train on the same batches, so the run must be the single-process run: the same
steps, stop reason and losses, and the same weights up to float32 rounding of the averaged gradients."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.methods import params_for
from lethe.engine.sharded_run import run_sharded
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow


def test_two_fsdp_processes_train_as_one(fixture_model, people, tmp_path):
    records = [r for p in people for r in p]
    params = params_for("masc", {"lora": False, "max_steps": 6, "check_every": 3, "lr": 1e-4})
    single = run_unlearning(str(fixture_model), records[:4], records[4:], params=params, device="cpu")
    progress: list[dict] = []
    sharded = run_sharded(str(fixture_model), records[:4], records[4:], params=params, processes=2,
                          workdir=tmp_path, device="cpu", progress=progress.append)
    one = single.result.as_dict()
    assert (sharded["steps"], sharded["stop_reason"]) == (one["steps"], one["stop_reason"])
    for a, b in zip(one["loss_trace"], sharded["loss_trace"], strict=True):
        assert a["total"] == pytest.approx(b["total"], rel=1e-4, abs=1e-6)
    assert sharded["final_violation_rate"] == pytest.approx(one["final_violation_rate"], abs=1e-6)
    # Each process planned on its half of the weights, gradients, moments and frozen copy.
    halves = sharded["peak_memory"]["estimate"]
    assert halves["gradients_and_optimiser"] * 2 == pytest.approx(one["peak_memory"]["estimate"][
        "gradients_and_optimiser"], abs=2)
    assert progress and progress[-1]["step"] == sharded["steps"]  # rank 0's progress reached the caller
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    expected = dict(single.model.named_parameters())
    for name, parameter in saved.named_parameters():
        assert torch.allclose(parameter, expected[name], atol=1e-5), name
    assert json.loads((tmp_path / "result.json").read_text())["steps"] == sharded["steps"]


def test_fsdp_is_for_full_fine_tuning(fixture_model, people, tmp_path):
    with pytest.raises(EngineInputError, match="LoRA"):
        run_sharded(str(fixture_model), [r for p in people for r in p][:2], None, params=params_for("masc", {}),
                    processes=2, workdir=tmp_path, device="cpu")
