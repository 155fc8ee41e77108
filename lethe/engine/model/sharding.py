"""Full fine-tuning of a model too large for one device: FSDP (torch's fully_shard, FSDP2) over several processes,
one per GPU (NCCL), or on CPU with gloo (how the tests run it). Each decoder block and the whole model are sharded:
weights, gradients and AdamW's state are split across the processes; pi_0's frozen copy is sharded too.

Every process trains on the same batches, so every one computes the same losses and the same stop-rule decisions
(the rule's measurements are forward passes in lockstep), and the averaged gradient equals one process's: the run is
the single-process run with its memory divided. Rank 0 gathers the trained weights and saves the checkpoint.

    result = run_sharded(source, forget, retain, params=params, processes=2, workdir=tmp)  # sharded_run
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def shard(model, device: torch.device) -> None:
    """fully_shard each decoder block, then the root (what is left: embeddings, norm, head)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from lethe.engine.model.checkpointing import decoder_blocks

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in decoder_blocks(model):
        fully_shard(block, mesh=mesh)
    # The root too reshards after each forward pass: else a measurement pass leaves its unsharded parameters
    # registered, and an optimiser built then would hold them instead of the shards that get the gradients.
    fully_shard(model, mesh=mesh, reshard_after_forward=True)


def gathered(model, dtype: torch.dtype | None):
    """Every process takes part; rank 0 gets the plain model (on CPU) with the full weights, the others None."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank() != 0:
        return None
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config)
    plain.load_state_dict(state, assign=True, strict=False)
    plain.tie_weights()
    plain.eval()
    return plain.to(dtype) if dtype is not None else plain


def agreed(flag: bool, device: torch.device) -> bool:
    """True on every process when it is True on any (a cancellation must stop all at the same step)."""
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)
