"""Which modules LoRA adapts, for any architecture (SPEC section 3: "the attention and MLP projections
of whatever architecture the model has, found automatically").

Torch-free: the rule works on a plain inventory of modules (name, kind, shape), which comes from a live
model (`lethe.engine.model.loading.module_inventory`) or, before any model is loaded, from the tensor names
and shapes in a checkpoint's safetensors headers (`checkpoint_inventory`), so the API can refuse a
target that does not exist with the rule the engine applies.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.model_files import MAX_HEADER_BYTES

AUTO = "auto"
PROJECTION_KINDS = ("linear", "conv1d")  # nn.Linear and transformers' Conv1D (GPT-2 and kin)
_BLOCK_INDEX = re.compile(r"\.\d+\.")  # a module inside a repeated block: "...layers.3.mlp.up_proj"


@dataclass(frozen=True)
class ModuleInfo:
    name: str  # the full module name, as named_modules() gives it
    kind: str  # "linear", "conv1d", "embedding" or "other"
    in_features: int = 0
    out_features: int = 0


@dataclass(frozen=True)
class Shape:
    """What the rule needs from the model's config."""
    vocab_size: int = 0
    expert_counts: tuple[int, ...] = ()  # a router's output size: routers are not projections
    output_head: str = ""  # the output embedding's module name
    decoder_prefix: str = ""  # where the language model lives inside a wrapper ("" = everywhere)


def auto_targets(modules: list[ModuleInfo], shape: Shape) -> list[str]:
    """Every attention and MLP projection: a Linear or Conv1D inside the repeated decoder blocks, never
    the embeddings, the output head, a vocabulary-sized projection, or an MoE router."""
    chosen = []
    for m in modules:
        if m.kind not in PROJECTION_KINDS or m.name == shape.output_head:
            continue
        if shape.decoder_prefix and not m.name.startswith(shape.decoder_prefix + "."):
            continue
        if not _BLOCK_INDEX.search("." + m.name + "."):
            continue  # outside the blocks: embedding projections, poolers, heads
        if shape.vocab_size and shape.vocab_size in (m.in_features, m.out_features):
            continue
        if m.out_features in shape.expert_counts:
            continue
        chosen.append(m.name)
    return chosen


def block_index(name: str) -> int | None:
    """The number of the repeated block a module sits in ("model.layers.3.mlp" -> 3)."""
    found = _BLOCK_INDEX.search("." + name + ".")
    return int(found.group(0).strip(".")) if found else None


def mlp_output_projections(modules: list[ModuleInfo], shape: Shape, hidden_size: int, blocks: range) -> list[str]:
    """Per block, the projection that writes the MLP's output back to the residual stream: out_features is
    the hidden size and in_features is not (attention's output projection maps hidden to hidden)."""
    by_name = {m.name: m for m in modules}
    return [n for n in auto_targets(modules, shape) if block_index(n) in blocks
            and by_name[n].out_features == hidden_size and by_name[n].in_features != hidden_size]


def suffixes(names: list[str]) -> list[str]:
    """The distinct last components of module names, in first-seen order: what a person would write."""
    return list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))


def matches(name: str, target: str) -> bool:
    """peft's rule for a target name: the whole module name, or its dotted suffix."""
    return name == target or name.endswith("." + target)


def resolve_targets(requested, modules: list[ModuleInfo], shape: Shape) -> list[str]:
    """The full names of the modules to adapt. `requested` is "auto" or a list of names; a name that
    matches no module is refused with the list of projections the model has."""
    automatic = auto_targets(modules, shape)
    if requested == AUTO or requested == [AUTO]:
        if not automatic:
            raise EngineInputError(
                "lora_targets: found no attention or MLP projection (nn.Linear or Conv1D inside the "
                "model's blocks); name the modules to adapt, or set lora false for full fine-tuning",
                field="lora_targets")
        return automatic
    names = [m.name for m in modules]
    available = suffixes(automatic) or suffixes([m.name for m in modules if m.kind in PROJECTION_KINDS])
    missing = [t for t in requested if not any(matches(n, t) for n in names)]
    if missing:
        raise EngineInputError(f"lora_targets: the model has no modules named {missing}; its projections are "
                               f"{available}", field="lora_targets")
    chosen = [m for m in modules if any(matches(m.name, t) for t in requested)]
    unwrappable = [m.name for m in chosen if m.kind not in (*PROJECTION_KINDS, "embedding")]
    if unwrappable:
        raise EngineInputError(f"lora_targets: {unwrappable[0]} is not a Linear, Conv1D or Embedding, so LoRA "
                               f"cannot wrap it; its projections are {available}", field="lora_targets")
    return [m.name for m in chosen]


def check_requested(requested, modules: list[ModuleInfo], shape: Shape) -> None:
    """Refuse named targets that do not exist (what the API can tell before a worker loads the model)."""
    if requested != AUTO and requested != [AUTO]:
        resolve_targets(requested, modules, shape)


# --- the same inventory read from a checkpoint, without torch -----------------------------------------

def checkpoint_inventory(directory: str | Path) -> tuple[list[ModuleInfo], Shape] | None:
    """Modules with a matrix weight, from the safetensors headers and config.json of a from_pretrained
    directory; None when the directory has no safetensors (the worker then checks on the loaded model).
    A matrix is taken as a projection unless it is vocabulary-sized (an embedding or the head)."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    config_path = directory / "config.json"
    if not files or not config_path.is_file():
        return None
    config = json.loads(config_path.read_text(encoding="utf-8"))
    shape = shape_from_config(config)
    modules = []
    for path in files:
        for tensor, info in _safetensors_header(path).items():
            dims = info.get("shape") if isinstance(info, dict) else None
            if not tensor.endswith(".weight") or not dims or len(dims) != 2:
                continue
            name = tensor[: -len(".weight")]
            vocab_sized = shape.vocab_size in dims
            # Linear stores [out, in]; a checkpoint cannot tell Conv1D's [in, out] apart, and the
            # rule only needs the pair.
            modules.append(ModuleInfo(name, "embedding" if vocab_sized else "linear", dims[1], dims[0]))
    return modules, shape


def shape_from_config(config: dict) -> Shape:
    nested = config.get("text_config")
    text: dict = nested if isinstance(nested, dict) else {}
    merged = {**config, **text}
    experts = tuple(v for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
                    if isinstance(v := merged.get(k), int) and v > 0)
    return Shape(vocab_size=int(merged.get("vocab_size") or 0), expert_counts=experts)


def _safetensors_header(path: Path) -> dict:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > MAX_HEADER_BYTES:
            raise EngineInputError(f"{path.name}: a safetensors header of {length} bytes, over {MAX_HEADER_BYTES}")
        return json.loads(handle.read(length))
