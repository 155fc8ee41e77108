"""Any architecture: for every causal-LM family of the installed transformers, a tiny random model built
here, MASC with its default LoRA targets for a few steps, a save, and a from_pretrained reload."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.data.synthetic import synthetic_people
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.architectures import NOT_TEXT_LMS, Size, causal_lm_families, tiny_config
from lethe.engine.model.fixture import train_tokenizer
from lethe.engine.model.loading import behaves_linear, load_model, lora_modules, module_inventory, save_model
from lethe.engine.model.lora_targets import (
    ModuleInfo,
    Shape,
    auto_targets,
    check_requested,
    checkpoint_inventory,
    mlp_output_projections,
    resolve_targets,
    suffixes,
)
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

# The families a user is most likely to bring: these must build, never skip.
REQUIRED = ["gpt2", "gpt_neox", "llama", "mistral", "qwen2", "phi", "opt", "falcon", "gptj", "gemma"]
# Every family that builds, runs and reloads on transformers 5.24 (what `make install` resolves; measured by this test):
# one of these that stops building fails, it is not skipped. A family outside the list (new in a later transformers,
# or one whose default config does not shrink generically) is tried and skipped with its reason when it fails.
PINNED_TRANSFORMERS = "5.24"
BUILDS = (
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk2", "bart", "bert", "bert-generation",
    "big_bird", "bigbird_pegasus", "biogpt", "bitnet", "blenderbot", "blenderbot-small", "bloom", "camembert",
    "codegen", "cohere", "cohere2", "cohere2_moe", "cpmant", "ctrl", "cwm", "data2vec-text", "deepseek_v2",
    "deepseek_v3", "deepseek_v4", "diffllama", "doge", "electra", "ernie", "ernie4_5", "ernie4_5_moe", "exaone",
    "exaone4", "exaone_moe", "falcon", "falcon_mamba", "flex_olmo", "flint", "fuyu", "gemma", "gemma2", "gemma3_text",
    "gemma4_unified", "gemma4_unified_text", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "gpt-sw3",
    "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_neox_japanese", "gpt_oss", "gptj", "granite", "granite_swa",
    "granitemoe", "granitemoe_swa", "granitemoeshared", "helium", "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe",
    "hy_v3", "hy_v4", "hyperclovax", "inkling_text", "internlm3", "iquestcoder", "jais2", "jamba", "jetmoe",
    "kolibri1", "laguna", "lara_mini", "lfm2", "lfm3", "llama", "llama4", "llama4_text", "mamba", "marian", "mbart",
    "megatron-bert", "mellum", "mimo_v2_flash", "minicpm3", "minimax", "minimax_m2", "minimax_m3_vl_text",
    "ministral", "ministral3", "mistral", "mixtral", "modernbert-decoder", "mpt", "mvp", "nanochat", "nemotron",
    "nemotron_h", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "openai-gpt", "opt", "pegasus", "persimmon",
    "phi", "phi3", "phimoe", "plbart", "prophetnet", "qwen2", "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_moe",
    "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next", "rembert", "roberta", "roberta-prelayernorm",
    "roformer", "rwkv", "sarvam_mla", "sarvam_moe", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2",
    "trocr", "vaultgemma", "xglm", "xlm-roberta", "xlm-roberta-xl", "youtu"
)
# The modules a person would name for each, to check that "auto" finds every projection.
EXPECTED = {
    "gpt2": {"c_attn", "c_proj", "c_fc"},
    "gpt_neox": {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"},
    "llama": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "opt": {"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"},
    "falcon": {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"},
    "gptj": {"q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"},
    "phi": {"q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"},
}
MAX_PARAMETERS = 5_000_000  # a family whose default config does not shrink below this is skipped, named


@pytest.fixture(scope="module")
def records():
    people = synthetic_people(3, seed=1)
    return [r for p in people for r in p]


@pytest.fixture(scope="module")
def tokenizer(records):
    return train_tokenizer(records, 300)


def tiny_model(family: str, tokenizer):
    """The family's tiny model, or a reason why its default config cannot be shrunk generically."""
    sizes = [Size(vocab_size=len(tokenizer)), Size(vocab_size=len(tokenizer), kv_heads=4)]
    problem = None
    for size in sizes:
        try:
            config = tiny_config(family, size, eos_token_id=tokenizer.eos_token_id)
            with torch.device("meta"):
                count = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            if count > MAX_PARAMETERS:
                return None, f"{count:,} parameters after shrinking"
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
            for rows, width in ((2, 64), (3, 12)):  # longer and shorter than the records here
                ids = torch.arange(1, rows * width + 1).reshape(rows, width) % len(tokenizer)
                mask = torch.ones_like(ids)
                mask[1, width // 2:] = 0  # right padding, as in the engine's batches
                model(input_ids=ids, attention_mask=mask, use_cache=False)
            return model, None
        except Exception as exc:  # noqa: BLE001  the family's own construction or forward failed
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return None, problem


@pytest.mark.parametrize("family", [f for f in causal_lm_families() if f not in NOT_TEXT_LMS])
def test_masc_runs_saves_and_reloads_on_every_family(family, tokenizer, records, tmp_path):
    model, problem = tiny_model(family, tokenizer)
    if model is None:
        assert family not in REQUIRED and family not in BUILDS, f"{family} must build: {problem}"
        pytest.skip(f"{family}: its default config does not shrink generically ({problem})")
    source = tmp_path / "base"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    targets = lora_modules(model, "auto")
    assert targets, family
    if family in EXPECTED:
        assert set(suffixes(targets)) == EXPECTED[family]
    # Never the embeddings or the output head.
    modules, shape = module_inventory(model)
    kinds = {m.name: m.kind for m in modules}
    assert all(kinds[t] in ("linear", "conv1d") and t != shape.output_head for t in targets)

    if family in REQUIRED:
        # The default with named secrets: each record's secret placed on this family's tokens, its counterfactuals
        # written by the model, targets on every token, the model's own answers replayed at every step. A random
        # model never says a secret, so only a limit of 1e-12 keeps the rule from firing at once; without retain
        # records no prior raises that limit.
        with_secrets = [dict(r, secrets=[r["completion"].rstrip(".").split()[-1]]) for r in records[:3]]
        named = run_unlearning(str(source), with_secrets, [], params=MascParams.from_dict(
            {"content_max_probability": 1e-12, "max_steps": 2, "replay_every": 1, "lr": 1e-3}))
        r = named.result.as_dict()
        assert r["stop_reason"] == "max_steps" and r["secrets"]["located"] == 3 and r["secrets"]["unaligned"] == 0
        assert all("target" in entry for entry in r["loss_trace"])

    # Whole records: rho 1e-12 (tau -27.6): nearly every token of a random model counts as dominant, so with
    # ceilings of 0.01 the rule cannot fire before the cap of 3 steps.
    params = MascParams.from_dict({"rho": 1e-12, "alpha": 0.01, "record_ceiling": 0.01, "max_steps": 3, "lr": 1e-3,
                                   "suppress": "whole", "lora": True})
    outcome = run_unlearning(str(source), records[:3], records[3:9], params=params)
    assert outcome.result.as_dict()["stop_reason"] == "max_steps" and outcome.result.as_dict()["steps"] == 3
    assert outcome.result.as_dict()["lora"]["count"] == len(targets)
    base = dict(AutoModelForCausalLM.from_pretrained(source).named_parameters())
    changed = [n for n, p in outcome.model.named_parameters() if n in base and not torch.equal(p, base[n])]
    assert changed, "the merged LoRA update changed no weight"

    save_model(outcome.model, outcome.tokenizer, tmp_path / "new")
    reloaded, _ = load_model(tmp_path / "new", torch.device("cpu"))
    ids = torch.tensor([tokenizer(records[0]["prompt"] + records[0]["completion"])["input_ids"]])
    with torch.no_grad():
        before = outcome.model(input_ids=ids, use_cache=False).logits
        after = reloaded(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


def test_every_pinned_family_is_still_there():
    import transformers

    if not transformers.__version__.startswith(PINNED_TRANSFORMERS + "."):
        pytest.skip(f"the list was measured on transformers {PINNED_TRANSFORMERS}, this is {transformers.__version__}")
    assert set(REQUIRED) <= set(BUILDS)
    assert sorted(set(BUILDS) - set(causal_lm_families())) == []


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_named_target_that_does_not_exist_is_refused_with_the_modules_that_do(family, tokenizer, tmp_path):
    model, _ = tiny_model(family, tokenizer)
    with pytest.raises(EngineInputError, match=r"no modules named \['q_proj_typo'\]; its projections are \[") as err:
        lora_modules(model, ["q_proj_typo"])
    for name in EXPECTED[family]:
        assert repr(name) in str(err.value)
    # The same check without torch, from the checkpoint's safetensors headers (what the API does).
    model.save_pretrained(tmp_path)
    inventory, shape = checkpoint_inventory(tmp_path)
    with pytest.raises(EngineInputError, match="q_proj_typo"):
        check_requested(["q_proj_typo"], inventory, shape)
    check_requested(sorted(EXPECTED[family]), inventory, shape)  # real names pass
    check_requested("auto", inventory, shape)


def test_auto_targets_skip_routers_and_towers_outside_the_language_model(tokenizer):
    model, _ = tiny_model("mixtral", tokenizer)
    modules, shape = module_inventory(model)
    chosen = auto_targets(modules, shape)
    assert chosen and not any(name.endswith(".gate") for name in chosen)  # the router stays as it is
    assert all(m.out_features not in shape.expert_counts for m in modules if m.name in chosen)


def test_the_target_rule_on_a_written_out_inventory():
    modules = [ModuleInfo("model.embed_tokens", "embedding", 100, 16),
               ModuleInfo("model.layers.0.self_attn.q_proj", "linear", 16, 16),
               ModuleInfo("model.layers.0.mlp.down_proj", "linear", 32, 16),
               ModuleInfo("model.layers.0.mlp.gate", "linear", 16, 4),  # a router over 4 experts
               ModuleInfo("model.layers.0.mtp_head", "linear", 16, 100),  # vocabulary-sized
               ModuleInfo("model.layers.0.mlp.grouped", "other", 16, 16),  # a Linear that is not one
               ModuleInfo("model.project_in", "linear", 16, 16),  # outside the blocks
               ModuleInfo("vision.layers.0.proj", "linear", 16, 16),  # another tower
               ModuleInfo("lm_head", "linear", 16, 100)]
    shape = Shape(vocab_size=100, expert_counts=(4,), output_head="lm_head", decoder_prefix="model")
    assert auto_targets(modules, shape) == ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"]
    assert resolve_targets(["q_proj"], modules, shape) == ["model.layers.0.self_attn.q_proj"]
    assert resolve_targets(["mlp.gate"], modules, shape) == ["model.layers.0.mlp.gate"]  # named: as asked
    with pytest.raises(EngineInputError, match=r"no modules named \['k_proj'\]; its projections are \['q_proj', "
                                                r"'down_proj'\]"):
        resolve_targets(["k_proj"], modules, shape)
    with pytest.raises(EngineInputError, match="model.layers.0.mlp.grouped is not a Linear, Conv1D or Embedding"):
        resolve_targets(["grouped"], modules, shape)
    assert mlp_output_projections(modules, shape, 16, range(0, 1)) == ["model.layers.0.mlp.down_proj"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_linear_subclass_is_adapted_only_if_it_computes_wx_plus_b(dtype):
    """In half precision too (bfloat16 is the default on a GPU): Falcon's x @ W.T + b rounds twice."""
    class Plain(torch.nn.Linear):
        def forward(self, x):  # the same map written another way (Falcon's FalconLinear does this)
            return x @ self.weight.T + self.bias

    class Grouped(torch.nn.Linear):
        def forward(self, x):  # not Wx + b
            return super().forward(x).flip(-1)

    torch.manual_seed(0)
    for n in (8, 1024):
        assert behaves_linear(torch.nn.Linear(n, 6).to(dtype)) and behaves_linear(Plain(n, 6).to(dtype))
        assert not behaves_linear(Grouped(n, 6).to(dtype))
