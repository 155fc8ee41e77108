"""LoRA over several GPUs (issue 15), planned where no GPU exists: accelerate's plan on the meta device places the
blocks of a model over GPU budgets that one alone could not hold, never past a budget; budgets too small for all
of them leave modules off the GPUs, which the engine takes as "does not fit". The device-map load path itself runs
on CPU."""
import pytest
import torch
from accelerate.utils import compute_module_sizes
from transformers import LlamaConfig

from lethe.engine.contract.memory_plan import HEADROOM, MemoryPlan
from lethe.engine.data.synthetic import synthetic_people
from lethe.engine.model.device_map import gpu_budgets, on_gpus, plan_device_map
from lethe.engine.model.fixture import train_tokenizer
from lethe.engine.model.loading import load_weights
from lethe.engine.model.memory_check import meta_model
from tests.engine.model.test_architectures import tiny_model


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    tokenizer = train_tokenizer([r for p in synthetic_people(3, seed=1) for r in p], 300)
    model, problem = tiny_model("llama", tokenizer)
    assert model is not None, problem
    source = tmp_path_factory.mktemp("llama") / "model"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    return source, model.config


# Six blocks, so that they can be split (accelerate keeps room for the largest block on every GPU).
SIX_BLOCKS = LlamaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=True)


def test_a_model_too_large_for_one_gpu_is_placed_over_two():
    model = meta_model(SIX_BLOCKS)
    sizes = compute_module_sizes(model, dtype=torch.bfloat16)
    total = sizes[""]
    budgets = {0: int(total * 0.7), 1: int(total * 0.7)}  # neither alone holds it
    mapping = plan_device_map(model, "bfloat16", budgets)
    assert on_gpus(mapping) and set(mapping.values()) == {0, 1}
    assert {mapping[f"model.layers.{i}"] for i in range(6)} == {0, 1}  # the blocks themselves are split
    for gpu, budget in budgets.items():
        placed = sum(sizes[name] for name, place in mapping.items() if place == gpu)
        assert placed <= budget, (gpu, placed, budget)
    # Every parameter is placed exactly once.
    names = [n for n, _ in model.named_parameters()]
    assert all(sum(1 for m in mapping if n == m or n.startswith(m + ".") or m == "") == 1 for n in names)


def test_budgets_too_small_for_the_gpus_leave_it_off_them():
    model = meta_model(SIX_BLOCKS)
    total = compute_module_sizes(model, dtype=torch.bfloat16)[""]
    assert not on_gpus(plan_device_map(model, "bfloat16", {0: total // 4, 1: total // 4}))


def test_budgets_keep_the_transient_memory_free():
    plan = MemoryPlan({"weights": 10, "adapters_and_optimiser": 5, "training_step": 100, "measurement": 40}, 115)
    assert gpu_budgets(plan, [1100, 2200]) == {0: int(1100 / HEADROOM) - 105, 1: int(2200 / HEADROOM) - 105}


def test_the_device_map_load_path(saved_llama):
    source, _ = saved_llama
    model = load_weights(source, torch.device("cpu"), torch.bfloat16, device_map={"": "cpu"})
    assert not model.training and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
