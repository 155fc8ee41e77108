"""Tiny configurations of any causal-LM family in the installed transformers: the fixture builder's
`--arch`, and the test that runs MASC on every family. Built from the family's own default config with
its sizes shrunk, so a family added to transformers is covered without a line here."""
from __future__ import annotations

from dataclasses import dataclass

from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

# Families whose causal-LM class is not a text model one can train on token ids alone, or whose
# default config cannot be shrunk generically; each with the reason, so the list stays honest.
NOT_TEXT_LMS = {
    "musicgen": "audio codebooks, not token ids", "musicgen_melody": "audio codebooks, not token ids",
    "moshi": "audio model", "whisper": "speech decoder, needs encoder states",
    # multimodal: the causal-LM class saves a text config that AutoModelForCausalLM does not map back
    "emu3": "image and text model", "mllama": "image and text model",
    "reformer": "needs is_decoder and chunked attention settings",
    "xmod": "needs a language adapter chosen per input",
}


@dataclass
class Size:
    vocab_size: int = 256
    hidden_size: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 64
    context: int = 256


def causal_lm_families() -> list[str]:
    """Every model type that AutoModelForCausalLM knows in the installed transformers."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str, size: Size | None = None, *, eos_token_id: int = 0, pad_token_id: int | None = None):
    """The family's default config with every size attribute it has set to `size`."""
    s = size or Size()
    config = AutoConfig.for_model(model_type)
    head_dim = s.hidden_size // s.heads
    values = {
        # names of the same quantity across families
        "vocab_size": s.vocab_size, "hidden_size": s.hidden_size, "n_embd": s.hidden_size, "d_model": s.hidden_size,
        "word_embed_proj_dim": s.hidden_size, "num_hidden_layers": s.layers, "n_layer": s.layers,
        "num_layers": s.layers, "decoder_layers": s.layers, "num_attention_heads": s.heads, "n_head": s.heads,
        "num_heads": s.heads, "decoder_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
        "head_dim": head_dim, "intermediate_size": s.intermediate_size, "n_inner": s.intermediate_size,
        "ffn_dim": s.intermediate_size, "decoder_ffn_dim": s.intermediate_size,
        "max_position_embeddings": s.context, "n_positions": s.context, "n_ctx": s.context,
        "rotary_dim": head_dim // 2, "sliding_window": s.context,
        # mixtures of experts
        "moe_intermediate_size": s.intermediate_size // 2, "shared_expert_intermediate_size": s.intermediate_size // 2,
        "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
        # state-space layers (Mamba and hybrids)
        "mamba_d_ssm": 2 * s.hidden_size, "mamba_n_heads": s.heads, "mamba_d_state": 16, "mamba_chunk_size": 16,
        "state_size": 16, "ssm_state_size": 16, "chunk_size": 16,
        # sparse and compressed attention
        "o_lora_rank": 16, "index_n_heads": 2, "index_head_dim": head_dim, "index_topk": 16,
        # latent attention
        "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": head_dim, "qk_nope_head_dim": head_dim,
        "v_head_dim": head_dim, "qk_head_dim": head_dim,
        # token ids inside the tiny vocabulary
        "eos_token_id": eos_token_id, "bos_token_id": eos_token_id,
        "pad_token_id": eos_token_id if pad_token_id is None else pad_token_id,
        "decoder_start_token_id": eos_token_id,
        "tie_word_embeddings": True, "is_decoder": True,
    }
    for target in _sub_configs(config):
        own = _own_attributes(target)
        depth = next((own[k] for k in ("num_hidden_layers", "num_layers", "n_layer") if isinstance(own.get(k), int)), 0)
        for name, value in _own_attributes(target).items():  # per-layer lists and maps follow the depth
            if isinstance(value, list) and depth and len(value) == depth and name != "layer_types":
                _set(target, name, _keep_each_kind(value, s.layers))
            elif name == "per_layer_config" and isinstance(value, dict):
                _set(target, name, {k: v for k, v in value.items() if int(k) < s.layers})
        for name, value in values.items():
            if name in _own_attributes(target):
                _set(target, name, value)
        if "attention_types" in _own_attributes(target):  # GPT-Neo: [[kinds, repeats]] expands to the layers
            _set(target, "attention_types", [[["global", "local"], max(1, s.layers // 2)]])
        layer_types = getattr(target, "layer_types", None)
        if isinstance(layer_types, list) and len(layer_types) > s.layers:
            target.layer_types = _keep_each_kind(layer_types, s.layers)
    # The round trip runs the family's own validation, as from_pretrained will on the saved config.
    return type(config).from_dict(config.to_dict())


def _set(config, name: str, value) -> None:
    try:
        setattr(config, name, value)
    except Exception:  # noqa: BLE001  a derived or read-only attribute: the family's default stays
        pass


def _sub_configs(config) -> list:
    subs = [getattr(config, name) for name in ("text_config", "decoder") if hasattr(config, name)]
    return [config] + [c for c in subs if c is not None and hasattr(c, "to_dict")]


def _own_attributes(config) -> dict:
    return config.to_dict()


def _keep_each_kind(layer_types: list, n: int) -> list:
    """The first n layer types, keeping at least one layer of every kind the family mixes."""
    kinds = list(dict.fromkeys(layer_types))
    head = layer_types[:n]
    missing = [k for k in kinds if k not in head]
    return (head[:n - len(missing)] + missing) if missing and len(missing) < n else head
