"""The precision a run trains in (the `dtype` parameter): which dtype the weights are loaded in, whether forward
passes run under autocast, whether the loss is scaled, and the dtype the checkpoint is saved in.

- LoRA: the frozen base is held in `dtype`; peft keeps the adapters (and so their gradients and AdamW's moments)
  in float32. Training's forward passes run under autocast in `dtype`, so that what the backward pass keeps of
  each adapter's input is half too (peft alone would keep a float32 copy of it for every adapted module).
- Full fine-tuning: the trained weights and AdamW's state stay float32 (bfloat16 weights would round away most
  updates of a small learning rate); forward passes run under autocast in `dtype`, and pi_0's frozen copy, which
  is only read, is held in `dtype`.
- float16 overflows where bfloat16 does not: its loss is scaled (GradScaler).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def default_dtype(device: torch.device) -> str:
    """"auto": bfloat16 on a GPU that has it (float16 on older ones), float32 on CPU, where half-precision
    kernels are no faster and the engine's figures stay exact."""
    if device.type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


@dataclass(frozen=True)
class Precision:
    name: str  # float32 | bfloat16 | float16
    lora: bool
    device: torch.device

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    @property
    def half(self) -> bool:
        return self.name != "float32"

    @property
    def load_dtype(self) -> torch.dtype:
        """What the weights are loaded in: the base in `dtype` under LoRA; float32 master weights in full mode."""
        return self.dtype if self.lora else torch.float32

    @property
    def reference_dtype(self) -> torch.dtype:
        """Full mode: pi_0's frozen copy (only read) is held in `dtype`."""
        return self.dtype

    def autocast(self, model=None) -> contextlib.AbstractContextManager:
        """Training's forward passes in half precision: autocast (float32 weights are cast as they are used); with
        LoRA, peft's own cast of each adapter's input to float32 is turned off meanwhile (autocast casts anyway)."""
        if not self.half:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
        if self.lora and model is not None:
            from peft.helpers import disable_input_dtype_casting

            stack.enter_context(disable_input_dtype_casting(model))
        return stack

    def scaler(self) -> torch.amp.GradScaler | None:
        """float16's gradients underflow without loss scaling; bfloat16 has float32's range."""
        return torch.amp.GradScaler(self.device.type) if self.name == "float16" else None

    def describe(self) -> dict:
        if not self.lora:
            return {"dtype": self.name, "mode": "full", "trained_weights": "float32", "optimiser_state": "float32",
                    "forward": self.name, "frozen_copy": self.name}
        return {"dtype": self.name, "mode": "lora", "base": self.name, "adapters": "float32",
                "optimiser_state": "float32"}


def resolve_precision(requested: str, device: torch.device, *, lora: bool) -> Precision:
    """The `dtype` parameter on this device ("auto" resolved)."""
    name = default_dtype(device) if requested == "auto" else requested
    return Precision(name, lora, device)


def stored_dtype(config) -> torch.dtype:
    """The dtype a checkpoint was saved in (its config says; float32 where it does not), which the unlearned
    checkpoint keeps."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    return DTYPES.get(str(value).removeprefix("torch."), torch.float32)
