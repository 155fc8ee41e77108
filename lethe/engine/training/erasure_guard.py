"""Earlier erasures stay erased (issue 28): a run anchored to an earlier version of its lineage keeps its update off
the input directions that the erasures between the anchor and its start wrote into each whitened projection.

Request n starts from version n-1 and its retain term pulls towards the anchor (the root), which still knows the
sets erased by requests 1..n-1. Whitening amplifies an update along the input directions retained text seldom uses,
which are the erased records' own, so without a guard a later run can undo part of an earlier erasure (measured: one
record of set 1 reproduced word for word after request 2, bench_chain). The service keeps no text of an erased set,
so the directions are read from the weights, which every version keeps anyway: for a projection with inputs x and
D = W_start - W_anchor, the inputs an earlier erasure was about are those whose output it changed most for their
energy under the retained inputs' damped second moment A = C + lambda I, the maximisers of ||D x||^2 / x^T A x:
x = A^(-1/2) b for the top right singular vectors b of D A^(-1/2). That holds whatever optimiser wrote D (Adam's
per-coordinate steps have no low-rank row space to read), and it picks the erased records' own directions, not the
common ones every input shares (measured on the test fixture: the raw top directions of D hold about as much of the
retained inputs' energy as of the erased ones'). The fewest b that hold `energy` of the whitened delta's squared
norm, at most `max_share` of the input width, give the protected subspace X = orth(A^(-1/2) b), one per distinct
input (q, k and v share theirs: their deltas are stacked). After every optimiser step each protected weight is
projected back:

    W <- W - (W - W_start) X X^T,      so that (W - W_start) x = 0 for every x in span X,

which is exact whatever the optimiser does to the gradient (Adam's per-coordinate scaling included), and costs one
[out, r] product per step. The run's own forget records are free along every other direction."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.pytorch_utils import Conv1D

ENERGY = 0.9  # share of the whitened delta's squared norm the protected directions hold
MAX_SHARE = 0.25  # at most this share of a projection's input width is protected
UNCHANGED = 1e-6  # a delta below this share of the weight's norm: nothing was erased there


def _weight(module: torch.nn.Module) -> torch.Tensor:
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{type(module).__name__} has no weight tensor")
    return weight


def _as_out_in(module: torch.nn.Module) -> torch.Tensor:
    """[out, in] float32 (GPT-2's Conv1D stores [in, out])."""
    w = _weight(module).detach().float()
    return w.T if isinstance(module, Conv1D) else w


def damped_inverse_root(moment: torch.Tensor, damping: float) -> torch.Tensor:
    """A^(-1/2), A = C + damping * mean diag C * I (the same damping as training.whitening)."""
    # The ridge bounds A's condition number, so float32 does for wide inputs (an MLP's 11,008: float64 is slow there).
    dtype = torch.float64 if moment.shape[0] <= 2048 else torch.float32
    ridge = damping * moment.diagonal().mean().clamp(min=1e-12)
    values, vectors = torch.linalg.eigh(moment.to(dtype) + ridge.to(dtype) * torch.eye(
        moment.shape[0], dtype=dtype, device=moment.device))
    return ((vectors * values.clamp(min=1e-30).rsqrt()) @ vectors.T).float()


def most_protected(width: int, max_share: float = MAX_SHARE) -> int:
    """The most directions protected for an input this wide."""
    return max(1, int(width * max_share))


def protected_subspace(deltas: list[torch.Tensor], inverse_root: torch.Tensor, energy: float = ENERGY,
                       max_share: float = MAX_SHARE) -> torch.Tensor:
    """X ([in, r], orthonormal columns): the input directions the stacked [out, in] deltas respond to most for their
    energy under A (see the module's docstring). `inverse_root`: A^(-1/2)."""
    whitened = torch.cat(deltas) @ inverse_root
    width = whitened.shape[1]
    limit = most_protected(width, max_share)
    if width > 1024:  # a big projection: its top directions only
        _, s, v = torch.svd_lowrank(whitened, q=min(limit + 8, min(whitened.shape)), niter=4)
    else:
        _, s, vh = torch.linalg.svd(whitened, full_matrices=False)
        v = vh.T
    share = (s ** 2).cumsum(0) / (whitened ** 2).sum().clamp(min=1e-30)
    rank = min(int((share < energy).sum().item()) + 1, limit, len(s))
    basis, _ = torch.linalg.qr(inverse_root @ v[:, :rank])
    return basis


def _project_back(weight: torch.Tensor, start_along: torch.Tensor, basis: torch.Tensor,
                  transposed: bool) -> Callable[[], None]:
    """W <- W - (W X - W_start X) X^T, in place (Conv1D: the same on W^T)."""
    @torch.no_grad()
    def project() -> None:
        x = basis.to(weight.device)
        if transposed:
            weight.sub_((x @ (x.T @ weight.float() - start_along)).to(weight.dtype))
        else:
            weight.sub_(((weight.float() @ x - start_along) @ x.T).to(weight.dtype))
    return project


@torch.no_grad()
def guard_erasures(modules: dict[str, torch.nn.Module], anchor: Any, moments: dict[str, torch.Tensor],
                   damping: float, max_share: float = MAX_SHARE) -> tuple[list[Callable[[], None]], dict]:
    """The projections that keep a run off its lineage's earlier erasures (see the module's docstring): one callable
    per protected weight, run after every optimiser step, and a summary for the result (how many inputs, how many
    directions in all, how many inputs hit the max_share cap). No anchor, or no change since it: nothing."""
    if anchor is None:
        return [], {"inputs": 0, "directions": 0, "capped": 0, "reason": "no anchor: nothing erased before this run"}
    theirs = dict(anchor.named_modules())
    groups: dict[int, list[str]] = {}
    for name in modules:
        groups.setdefault(id(moments[name]), []).append(name)
    constraints: list[Callable[[], None]] = []
    inputs = directions = capped = 0
    for names in groups.values():
        deltas = []
        for name in names:
            mine = _as_out_in(modules[name])
            delta = mine - _as_out_in(theirs[name]).to(mine.device)
            if delta.norm() > UNCHANGED * mine.norm():
                deltas.append(delta)
        if not deltas:
            continue
        moment = moments[names[0]]
        basis = protected_subspace(deltas, damped_inverse_root(moment, damping), max_share=max_share)
        inputs, directions = inputs + 1, directions + basis.shape[1]
        capped += basis.shape[1] >= most_protected(moment.shape[0], max_share)
        for name in names:
            module = modules[name]
            transposed = isinstance(module, Conv1D)
            weight = _weight(module)
            start_along = (basis.T @ weight.float()) if transposed else (weight.float() @ basis)
            constraints.append(_project_back(weight, start_along, basis, transposed))
    return constraints, {"inputs": inputs, "directions": directions, "capped": capped, "energy": ENERGY,
                         "max_share": max_share}
