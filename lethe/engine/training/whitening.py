"""Whitened updates (full fine-tuning): each decoder projection W (y = W x) trains on its gradient G times the inverse
of its inputs' damped second moment on the retain records,

    G' = G (C + lambda I)^-1 / mean diag((C + lambda I)^-1),    C = E_retain[x x^T],   lambda = damping * mean diag C,

as MEMIT shapes its edits by the key covariance. A gradient step changes W x by (G' x); whitening shrinks it along
the input directions where retained text has most of its energy and leaves it along the directions that are the
forget records' own, so an update reaches less of what the model knows but no retain record holds (issue 28: on the
sequential fixture the world facts outside every retain set lost about a quarter of the margin per unit of forget
progress). The scale normalisation keeps the gradient's size about where it was, so the learning rate means the same.
Only the whitened projections train: the embeddings and norms stay as they are."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.pytorch_utils import Conv1D

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.data.records import EncodedRecord, batches
from lethe.engine.model.loading import TrainableModel
from lethe.engine.model.lora_targets import suffixes
from lethe.engine.training.erasure_guard import MAX_SHARE, guard_erasures


@torch.no_grad()
def input_second_moments(model: Any, modules: dict[str, torch.nn.Module], records: list[EncodedRecord], pad_id: int,
                         batch_size: int = 16) -> dict[str, torch.Tensor]:
    """E[x x^T] (float32, [in, in]) of each module's input over the records' real (unpadded) tokens. Modules that
    read the same input tensor (q, k and v; gate and up) share one moment: the same tensor object, summed once."""
    device = next(model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    counts = dict.fromkeys(modules, 0)
    real: list[torch.Tensor] = []  # the current batch's attention mask, read by the hooks
    reads_as: dict[str, str] = {}  # a module -> the first module that read the same input (found on the first batch)
    previous: list[Any] = [None, ""]  # the last input seen and its module, held so that `is` cannot match a new one
    first = [True]

    def hook(name: str) -> Callable[[torch.nn.Module, tuple], None]:
        def record(_module: torch.nn.Module, inputs: tuple) -> None:
            if first[0]:
                if inputs[0] is previous[0] and previous[1] != name:
                    reads_as[name] = reads_as.get(previous[1], previous[1])
                previous[:] = [inputs[0], name]
            if name in reads_as:
                return
            x = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])[real[0].reshape(-1)]
            sums[name] = sums[name] + x.T @ x if name in sums else x.T @ x
            counts[name] += len(x)
        return record

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in modules.items()]
    try:
        for batch in batches(records, batch_size, pad_id):
            batch = batch.to(device)
            real[:] = [batch.attention_mask.bool()]
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
            first[0] = False
            previous[:] = [None, ""]
    finally:
        for handle in handles:
            handle.remove()
    moments = {name: sums[name] / counts[name] for name in modules if counts[name]}
    return {**moments, **{name: moments[leader] for name, leader in reads_as.items() if leader in moments}}


def whitening(moment: torch.Tensor, damping: float) -> torch.Tensor:
    """(C + damping * mean diag C * I)^-1, scaled to mean diagonal 1."""
    size = moment.shape[0]
    ridge = damping * moment.diagonal().mean().clamp(min=1e-12)
    inverse = torch.linalg.inv(moment + ridge * torch.eye(size, device=moment.device, dtype=moment.dtype))
    inverse = (inverse + inverse.T) / 2  # symmetric up to rounding
    return inverse / inverse.diagonal().mean()


def _weight_hook(inverse: torch.Tensor, transposed: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """G -> G C^-1 for a Linear's [out, in] weight; C^-1 G for GPT-2's Conv1D, which stores [in, out]."""
    def hook(gradient: torch.Tensor) -> torch.Tensor:
        g = gradient.float()
        return (inverse @ g if transposed else g @ inverse).to(gradient.dtype)
    return hook


def whiten_updates(trainable: TrainableModel, module_names: list[str], records: list[EncodedRecord], pad_id: int,
                   damping: float, batch_size: int = 16, guard: bool = True, guard_share: float = MAX_SHARE) -> dict:
    """Train only the named projections (Linear, or GPT-2's Conv1D; other kinds of module are left out) of a full-mode
    trainable model, each on its whitened gradient (see the module's docstring), the second moments measured on
    `records` by the model as it starts. Returns (and keeps as `trainable.whitened`, for the result) which modules, how
    many projections, on how many records. `guard` (with the trainable's anchor): each step is also kept off the
    input directions of the erasures between the anchor and the start (training.erasure_guard), at most `guard_share`
    of each input's width."""
    if trainable.lora or trainable.sharded:
        raise EngineInputError("whiten_updates needs full fine-tuning on one device (lora false, not sharded)",
                               field="whiten_updates")
    if not records:
        raise EngineInputError("whiten_updates needs retain records: the second moments are measured on them",
                               field="whiten_updates")
    model = trainable.model
    named = dict(model.named_modules())
    # A method that trains a few modules only (RMU) keeps to them: a projection it froze stays frozen.
    modules = {name: named[name] for name in module_names
               if isinstance(named[name], (torch.nn.Linear, Conv1D)) and named[name].weight.requires_grad}
    if not modules:
        raise EngineInputError("whiten_updates: none of the chosen modules is a linear projection",
                               field="whiten_updates")
    moments = input_second_moments(model, modules, records, pad_id, batch_size)
    trainable.restrict_training(list(modules))
    inverses: dict[int, torch.Tensor] = {}  # one per distinct input (q, k and v share theirs)
    for name, module in modules.items():
        key = id(moments[name])
        if key not in inverses:
            inverses[key] = whitening(moments[name], damping)
        inverse = inverses[key]
        module.weight.register_hook(_weight_hook(inverse, isinstance(module, Conv1D)))
    trainable.whitened = {"modules": suffixes(list(modules)), "projections": len(modules), "inputs": len(inverses),
                          "records": len(records), "damping": damping}
    if guard:
        constraints, guarded = guard_erasures(modules, trainable.anchor, moments, damping, guard_share)
        trainable.constraints.extend(constraints)
        trainable.whitened["guarded"] = guarded
    return trainable.whitened
