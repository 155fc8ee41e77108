"""Gradient checkpointing for any decoder: each block of the model's stack recomputes its activations in the
backward pass. transformers' own switch acts only in training mode, and the engine keeps models in eval mode
(no dropout: pi_0 exact, V deterministic), so the blocks are wrapped here."""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from lethe.engine.contract.errors import EngineInputError


def decoder_blocks(model) -> torch.nn.ModuleList:
    """The stack of decoder blocks: the module list holding most of the parameters."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        raise EngineInputError("gradient_checkpointing: this model has no stack of blocks to checkpoint",
                               field="gradient_checkpointing")
    return max(lists, key=lambda blocks: sum(p.numel() for p in blocks.parameters()))


def checkpoint_blocks(model) -> list[torch.nn.Module]:
    """Wrap each block's forward; returns the blocks (restore_blocks undoes it)."""
    blocks = list(decoder_blocks(model))
    for block in blocks:
        forward = block.forward

        def checkpointed(*args, _forward=forward, **kwargs):
            if not torch.is_grad_enabled():  # measuring, or pi_0: nothing to recompute
                return _forward(*args, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed
    return blocks


def restore_blocks(blocks: list[torch.nn.Module]) -> None:
    for block in blocks:
        block.__dict__.pop("forward", None)
