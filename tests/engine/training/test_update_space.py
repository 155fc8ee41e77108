"""lora "auto" (issue 28): whitened full fine-tuning where the run has retain records, runs in one process and fits,
LoRA otherwise; decided once and reported in the result's parameters."""
import math

import pytest

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.memory_plan import HEADROOM, MemoryPlan
from lethe.engine.contract.parameters import json_schema
from lethe.engine.methods import params_for
from lethe.engine.methods.baseline_params import BaselineParams
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.training.update_space import decide_update_space
from lethe.engine.unlearn import run_unlearning


def plans(peaks: dict[bool, int], capacity: int, asked: list):
    """A plan_for that records what it was asked and gives the peak of LoRA (True) or full (False)."""
    def plan_for(params):
        asked.append((params.lora, params.whiten_updates))
        return MemoryPlan(parts={}, peak_bytes=peaks[params.lora], capacity_bytes=capacity)
    return plan_for


def test_auto_is_whitened_full_fine_tuning_where_it_fits_else_lora():
    auto = MascParams.from_dict({"lora": "auto"})
    asked: list = []
    roomy = plans({True: 10, False: 100}, capacity=10_000, asked=asked)
    chosen = decide_update_space(auto, roomy, has_retain=True, sharded=False)
    assert (chosen.lora, chosen.whiten_updates) == (False, True)
    assert asked == [(False, True)]  # the plan of the whitened choice was the one asked
    tight = plans({True: 10, False: 100}, capacity=50, asked=[])  # LoRA fits with headroom (1.1), full does not
    chosen = decide_update_space(auto, tight, has_retain=True, sharded=False)
    assert (chosen.lora, chosen.whiten_updates) == (True, False)
    # No retain records (nothing to measure the second moments on), or sharded: LoRA, whatever the memory.
    for has_retain, sharded in ((False, False), (True, True)):
        chosen = decide_update_space(auto, roomy, has_retain=has_retain, sharded=sharded)
        assert (chosen.lora, chosen.whiten_updates) == (True, False)
    # Named whitening with "auto": full fine-tuning, which it needs, even where the plan will refuse it.
    named = MascParams.from_dict({"lora": "auto", "whiten_updates": True})
    assert decide_update_space(named, tight, has_retain=True, sharded=False).lora is False


@pytest.mark.parametrize("lora", [True, False])
def test_a_decided_lora_is_kept_as_given(lora):
    params = MascParams.from_dict({"lora": lora})
    assert decide_update_space(params, plans({}, 0, []), has_retain=True, sharded=False) is params


def test_auto_is_the_masc_default_the_published_presets_keep_lora():
    assert MascParams.from_dict({}).lora == "auto" and params_for("masc", {}).lora == "auto"
    for preset in ("qwen2.5-scaling", "tofu-llama2", "muse-news", "whole-record"):
        assert MascParams.from_dict({}, preset=preset).lora is True, preset  # SPEC section 3's parameter space
    assert MascParams.from_dict({"lora": "auto"}, preset="tofu-llama2").lora == "auto"  # a named value wins


def test_auto_is_a_masc_value_a_baseline_refuses_and_the_cli_and_schema_show():
    assert MascParams.from_dict({"lora": "auto"}).lora == "auto"
    assert params_for("masc", {"lora": "auto"}).lora == "auto"  # as the CLI's --lora auto gives it
    assert params_for("masc", {"lora": "false"}).lora is False
    with pytest.raises(EngineInputError, match="lora"):
        params_for("npo", {"lora": "auto"})
    with pytest.raises(EngineInputError, match="lora"):
        MascParams.from_dict({"lora": "sometimes"})
    assert json_schema(MascParams)["properties"]["lora"]["enum"] == [True, False, "auto"]
    assert json_schema(BaselineParams)["properties"]["lora"]["enum"] == [True, False]
    with pytest.raises(ValueError, match="decide it first"):
        _ = MascParams.from_dict({"lora": "auto"}).adapters


@pytest.mark.slow
def test_an_auto_run_trains_whitened_in_full_and_under_a_tight_limit_lora(fixture_model, forget_records,
                                                                            retain_records):
    forget, retain = forget_records[:4], retain_records[:8]
    auto = MascParams.from_dict({"max_steps": 3})  # "auto" is the default
    assert auto.lora == "auto"
    full = run_unlearning(str(fixture_model), forget, retain, params=auto)
    assert (full.result.params["lora"], full.result.params["whiten_updates"]) == (False, True)
    assert full.result.precision["mode"] == "full"
    lora = run_unlearning(str(fixture_model), forget, retain, params=MascParams.from_dict({"max_steps": 3,
                                                                                           "lora": True}))
    assert lora.result.precision["mode"] == "lora"
    lora_peak, full_peak = lora.result.peak_memory["estimate_bytes"], full.result.peak_memory["estimate_bytes"]
    assert lora_peak < full_peak
    # Room for LoRA's plan with its headroom, not for the whitened one's: "auto" falls back to LoRA.
    limit = math.ceil(lora_peak * HEADROOM)
    assert full_peak * HEADROOM > limit
    squeezed = run_unlearning(str(fixture_model), forget, retain, params=auto, memory_limit=limit)
    assert squeezed.result.params["lora"] is True and squeezed.result.precision["mode"] == "lora"
    # No retain records: LoRA.
    alone = run_unlearning(str(fixture_model), forget, [], params=auto)
    assert alone.result.params["lora"] is True
