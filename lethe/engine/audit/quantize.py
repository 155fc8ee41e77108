"""4-bit weight quantisation for the robustness check (SPEC section 5): NF4 through bitsandbytes on
CUDA; elsewhere group-wise round-to-nearest int4, applied to a copy and dequantised in place (the
forget metrics then run on exactly the weights a 4-bit deployment would use)."""
from __future__ import annotations

import copy

import torch

GROUP = 128


def rtn_int4(weight: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """Symmetric round-to-nearest to the integers -8..7, one scale per `group` inputs of each row."""
    rows, cols = weight.shape
    pad = (-cols) % group
    w = torch.nn.functional.pad(weight.float(), (0, pad)).reshape(rows, -1, group)
    scale = (w.abs().amax(dim=-1, keepdim=True) / 7).clamp(min=1e-12)
    q = (w / scale).round().clamp(-8, 7)
    return (q * scale).reshape(rows, -1)[:, :cols].to(weight.dtype)


@torch.no_grad()
def quantized_copy(model) -> tuple[object, str]:
    """A 4-bit copy of the model's linear layers, and the scheme's name."""
    clone = copy.deepcopy(model)
    if next(model.parameters()).device.type == "cuda":
        try:
            import bitsandbytes.functional as bnb

            for module in clone.modules():
                if isinstance(module, torch.nn.Linear):
                    packed, state = bnb.quantize_4bit(module.weight.data, quant_type="nf4")
                    module.weight.data = bnb.dequantize_4bit(packed, state).to(module.weight.dtype)
            return clone, "nf4 (bitsandbytes)"
        except ImportError:
            pass  # fall through to the portable scheme, and say so
    for module in clone.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data = rtn_int4(module.weight.data)
    return clone, f"int4 round-to-nearest, group {GROUP}"
