"""How much device memory a job will need at its peak, before it runs: from the model's shape (parameters, hidden
size, layers, heads, vocabulary), the precision, LoRA's adapters, the batch and the longest record. Torch-free, so
that the API can refuse at submission a job that cannot fit any worker, and the worker can fail one at start with
the estimate instead of running out of memory half-way.

    peak = static + max(training step, measurement pass)
    static        LoRA: base weights in dtype + adapters in float32 with their gradient and AdamW's two moments
                  full: float32 weights, gradients and two moments of what is trained, pi_0's copy in dtype
    training step saved activations of every block (one block's and the block inputs with gradient
                  checkpointing), the attention mask, and the logits with their float32 copies in the loss
    measurement   the stop rule's no-gradient passes over eval_batch_size records: their logits in float32

The coefficients were measured on CPU with lethe.engine.training.runtime.TensorMemory (see below);
tests/engine/contract/test_memory_plan.py
holds whole runs' estimates within [TOLERANCE_LOW, TOLERANCE_HIGH] times their measured
peaks. On CUDA the allocator's caching and fragmentation take more than the tensors: HEADROOM is kept free."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# estimate / measured peak of whole runs on CPU (tests/engine/contract/test_memory_plan.py): the estimate errs on the
# large side,
# measured 1.2-2.1x over four architectures, LoRA and full, float32 and bfloat16; 1.9-3.4x with checkpointing.
TOLERANCE_LOW = 0.9
TOLERANCE_HIGH = 2.25
TOLERANCE_CHECKPOINTED = 3.5
HEADROOM = 1.10  # the share of a device's memory a job may plan to use is 1 / HEADROOM
# Fitted by least squares on one training step and one measurement pass of MASC (the largest of the methods; the
# baselines' steps measured 0.7-0.8x of it) on qwen2, gpt2, llama and gpt_neox configurations with 16-160 tokens:
# elements each block keeps per token per unit of hidden size and of MLP width; float32 copies of the logits; the
# attention mask's copies (rows x tokens^2); in a measurement pass, copies of its logits and per-token hidden
# elements. Attention is assumed fused (sdpa, flash): no scores per head are kept.
PER_HIDDEN = 1.8
PER_INTERMEDIATE = 5.4
LOGIT_COPIES_TRAIN = 7.0
MASK_COPIES = 3.0
LOGIT_COPIES_MEASURE = 1.3
HIDDEN_MEASURE = 12.5

@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model; `adapter_parameters`: LoRA's, for the job's targets and rank."""
    parameters: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    adapter_parameters: int = 0
    trainable_parameters: int | None = None  # full mode: all unless the method trains a few modules


@dataclass(frozen=True)
class Workload:
    """The job's side: precision, LoRA or full, rows per training forward pass, the longest record in tokens."""
    dtype: str  # resolved: float32 | bfloat16 | float16
    lora: bool
    train_rows: int
    eval_rows: int
    max_tokens: int
    gradient_checkpointing: bool = False
    shards: int = 1  # FSDP processes: full mode's weights, gradients, moments and frozen copy split among them
    anchored: bool = False  # a fixed anchor version held for the retain term (issue 28): one more frozen copy
    whitened: bool = False  # whiten_updates: a float32 [in, in] inverse per distinct input (training.whitening)
    guarded: bool = False  # whitened and anchored with guard_erasures: training.erasure_guard's subspaces
    guard_share: float = 0.25  # guard_share: the most of each input's width a guard subspace spans


@dataclass
class MemoryPlan:
    parts: dict[str, int]
    peak_bytes: int
    capacity_bytes: int | None = None
    assumptions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.capacity_bytes is None or self.peak_bytes * HEADROOM <= self.capacity_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "fits": self.fits, "headroom": HEADROOM}

    def explain(self) -> str:
        gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
        parts = ", ".join(f"{k} {gib(v)}" for k, v in self.parts.items() if v)
        where = f" of {gib(self.capacity_bytes)} on the worker's device" if self.capacity_bytes else ""
        return (f"the job needs about {gib(self.peak_bytes)} at its peak ({parts}); with {HEADROOM:.2f}x headroom "
                f"that is more than the {gib(int(self.capacity_bytes / HEADROOM)) if self.capacity_bytes else '?'} "
                f"usable{where}")


def static_bytes(shape: ModelShape, work: Workload) -> dict[str, int]:
    """What the job holds from start to end, whatever its records."""
    half = BYTES[work.dtype]
    anchor = {"anchor_copy": shape.parameters * half} if work.anchored else {}
    if work.lora:
        return {"weights": shape.parameters * half, "adapters_and_optimiser": 16 * shape.adapter_parameters, **anchor}
    trained = shape.parameters if shape.trainable_parameters is None else shape.trainable_parameters
    n = work.shards
    # A block's projections read three hidden-sized inputs (q, k and v one, o one, gate and up one; GPT-2's fused
    # c_attn and c_fc the same) and one intermediate-sized (down); projections reading the same input share one.
    inverses = 4 * shape.layers * (3 * shape.hidden ** 2 + shape.intermediate ** 2)
    whitening = {"input_whitening": inverses} if work.whitened else {}
    # At most guard_share s of each input's width protected: a float32 [in, s in] basis per distinct input and an
    # [out, s in] product per projection (bounded by s of the weights in float32).
    guard = {"erasure_guard": int(work.guard_share * (inverses + 4 * shape.parameters))} \
        if work.whitened and work.guarded else {}
    return {"weights": shape.parameters * 4 // n, "gradients_and_optimiser": 12 * trained // n,
            "frozen_copy": shape.parameters * half // n, **anchor, **whitening, **guard}


def activation_bytes(shape: ModelShape, work: Workload) -> dict[str, int]:
    """The larger of one training step's and one measurement pass's transient memory."""
    act = BYTES[work.dtype]
    tokens = work.train_rows * work.max_tokens
    per_block = tokens * (PER_HIDDEN * shape.hidden + PER_INTERMEDIATE * shape.intermediate) * act
    if work.gradient_checkpointing:
        blocks = shape.layers * tokens * shape.hidden * act + per_block  # block inputs, one block recomputed
    else:
        blocks = shape.layers * per_block
    mask = MASK_COPIES * work.train_rows * work.max_tokens ** 2 * 4
    logit = (act + 4) / 2  # in half precision about half the copies are half (measured), the rest float32
    train = int(blocks + mask + tokens * shape.vocab * LOGIT_COPIES_TRAIN * logit)
    measured = work.eval_rows * work.max_tokens
    measure = int(measured * (shape.vocab * LOGIT_COPIES_MEASURE * logit + shape.hidden * HIDDEN_MEASURE * act))
    return {"training_step": train, "measurement": measure}

def estimate(shape: ModelShape, work: Workload, capacity_bytes: int | None = None) -> MemoryPlan:
    parts = static_bytes(shape, work)
    transient = activation_bytes(shape, work)
    peak = sum(parts.values()) + max(transient.values())
    return MemoryPlan({**parts, **transient}, peak, capacity_bytes)


def lower_bound(shape: ModelShape, work: Workload, capacity_bytes: int | None = None) -> MemoryPlan:
    """What a job needs whatever its records and targets (no activations, no adapters): the API's check, which
    must not refuse a job that would fit."""
    parts = static_bytes(shape, work)
    parts = {k: v for k, v in parts.items() if k != "adapters_and_optimiser"}
    return MemoryPlan(parts, sum(parts.values()), capacity_bytes, ["activations and adapters not counted"])


def shape_from_config(config: dict, parameters: int, adapter_parameters: int = 0,
                      trainable_parameters: int | None = None) -> ModelShape:
    """The sizes the estimate needs, under the names architectures use for them."""
    def first(*names: str, default: int = 0) -> int:
        for source in (config, config.get("text_config") or {}):
            for name in names:
                if isinstance(source.get(name), int) and source[name] > 0:
                    return source[name]
        return default

    hidden = first("hidden_size", "n_embd", "d_model", "dim", default=1)
    return ModelShape(parameters=parameters, hidden=hidden,
                      layers=first("num_hidden_layers", "n_layer", "num_layers", "n_layers", default=1),
                      heads=first("num_attention_heads", "n_head", "num_heads", "n_heads", default=1),
                      intermediate=first("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size",
                                         default=4 * hidden),
                      vocab=first("vocab_size", "padded_vocab_size", default=1),
                      adapter_parameters=adapter_parameters, trainable_parameters=trainable_parameters)


def safetensors_parameters(headers: list[dict]) -> int:
    """Parameters in a checkpoint, from its safetensors headers (each file's JSON header: name -> dtype, shape)."""
    return sum(math.prod(entry["shape"]) for header in headers for name, entry in header.items()
               if name != "__metadata__")
