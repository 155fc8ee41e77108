"""4-bit weight quantisation for the robustness check (SPEC section 5): NF4 through bitsandbytes on
CUDA; elsewhere group-wise round-to-nearest int4, applied to a copy and dequantised in place (the
forget metrics then run on exactly the weights a 4-bit deployment would use)."""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from transformers.pytorch_utils import Conv1D

GROUP = 128


def rtn_int4(weight: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """Symmetric round-to-nearest to the integers -8..7, one scale per `group` inputs of each row."""
    rows, cols = weight.shape
    pad = (-cols) % group
    w = torch.nn.functional.pad(weight.float(), (0, pad)).reshape(rows, -1, group)
    scale = (w.abs().amax(dim=-1, keepdim=True) / 7).clamp(min=1e-12)
    q = (w / scale).round().clamp(-8, 7)
    return (q * scale).reshape(rows, -1)[:, :cols].to(weight.dtype)


def projections(model) -> Iterator[tuple[torch.Tensor, bool]]:
    """The weights a 4-bit deployment quantises, each with whether it is stored inputs x outputs: nn.Linear's, and
    GPT-2's Conv1D's (which bitsandbytes loads as a 4-bit linear layer too), grouped along its inputs all the same."""
    seen: set[int] = set()  # a weight shared by two layers is quantised once
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | Conv1D) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            yield module.weight, isinstance(module, Conv1D)


@torch.no_grad()
def quantize_linears(model) -> str:
    """The model's linear layers (Conv1D included) quantised to 4 bits and dequantised, in place; returns the scheme's
    name."""
    layers = list(projections(model))
    if next(model.parameters()).device.type == "cuda":
        try:
            import bitsandbytes.functional as bnb

            for weight, transposed in layers:
                rows = weight.data.t() if transposed else weight.data
                packed, state = bnb.quantize_4bit(rows.contiguous(), quant_type="nf4")
                held = bnb.dequantize_4bit(packed, state).to(weight.dtype)
                weight.data = held.t().contiguous() if transposed else held
            return "nf4 (bitsandbytes)"
        except ImportError:
            pass  # fall through to the portable scheme, and say so
    for weight, transposed in layers:
        weight.data = rtn_int4(weight.data.t()).t().contiguous() if transposed else rtn_int4(weight.data)
    return f"int4 round-to-nearest, group {GROUP}"


@torch.no_grad()
def quantized_copy(model) -> tuple[object, str]:
    """A 4-bit copy of the model's linear layers, and the scheme's name."""
    clone = copy.deepcopy(model)
    return clone, quantize_linears(clone)


@contextlib.contextmanager
def quantized_in_place(model) -> Iterator[str]:
    """The model's linear layers held as a 4-bit deployment would hold them while the block runs, restored after: the
    originals wait in host memory, so no second copy of the model is made on its device."""
    originals = [(weight, weight.data.to("cpu", copy=True)) for weight, _ in projections(model)]
    try:
        yield quantize_linears(model)
    finally:
        with torch.no_grad():
            for weight, original in originals:
                weight.data = original.to(weight.device)
