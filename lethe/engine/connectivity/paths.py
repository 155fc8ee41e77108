"""Linear and quadratic Bezier paths between two versions' weights (SPEC section 6).

Only the tensors that differ between the ends move along a path; the rest stay where the model has
them, so a path over LoRA-derived versions touches only the adapted matrices."""
from __future__ import annotations

import torch
from torch import nn


def parameters_of(model) -> dict[str, torch.Tensor]:
    """The model's parameters by name (tied weights appear once, under their first name)."""
    return {name: p.detach() for name, p in model.named_parameters()}


def differing_names(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    if a.keys() != b.keys():
        missing = sorted(set(a) ^ set(b))[:3]
        raise ValueError(f"the two versions have different parameters (e.g. {missing})")
    for name in a:
        if a[name].shape != b[name].shape:
            raise ValueError(f"parameter {name}: shapes {tuple(a[name].shape)} and {tuple(b[name].shape)} differ")
    return [name for name in a if not torch.equal(a[name], b[name])]


def bezier_coefficients(t: float) -> tuple[float, float, float]:
    """Weights of theta_1, theta_c, theta_2 at t: (1-t)^2, 2t(1-t), t^2."""
    return (1 - t) ** 2, 2 * t * (1 - t), t ** 2


class ControlPoint(nn.Module):
    """theta_c over the differing tensors: a full trainable copy, or the midpoint plus a rank-r delta
    B A on each differing matrix (B starts at zero, so both start at the midpoint)."""

    def __init__(self, start: dict, end: dict, names: list[str], space: str = "full", rank: int = 16,
                 init: dict | None = None, seed: int = 0):
        super().__init__()
        self.names, self.space = list(names), space
        origin = {n: (init[n] if init is not None else (start[n] + end[n]) / 2).detach().clone() for n in names}
        self.full = nn.ParameterDict()
        self.down, self.up = nn.ParameterDict(), nn.ParameterDict()
        self._origin: dict[str, torch.Tensor] = {}
        generator = torch.Generator().manual_seed(seed)
        for i, name in enumerate(names):
            key = f"p{i}"
            if space == "lora" and origin[name].dim() == 2:
                rows, cols = origin[name].shape
                r = min(rank, rows, cols)
                self._origin[name] = origin[name]
                a = torch.randn(r, cols, generator=generator) / cols ** 0.5
                self.down[key] = nn.Parameter(a.to(origin[name]))
                self.up[key] = nn.Parameter(torch.zeros(rows, r, dtype=origin[name].dtype, device=origin[name].device))
            else:
                self.full[key] = nn.Parameter(origin[name])
        self._keys = {name: f"p{i}" for i, name in enumerate(names)}

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for name in self.names:
            key = self._keys[name]
            out[name] = (self.full[key] if key in self.full
                         else self._origin[name] + self.up[key] @ self.down[key])
        return out


class Path:
    """phi(t) over the differing tensors, differentiable in the control point."""

    def __init__(self, start: dict, end: dict, names: list[str], curve: str = "linear",
                 control: ControlPoint | None = None):
        if curve == "bezier" and control is None:
            raise ValueError("a Bezier path needs a control point")
        self.start = {n: start[n] for n in names}
        self.end = {n: end[n] for n in names}
        self.names, self.curve, self.control = list(names), curve, control

    def weights(self, t: float) -> dict[str, torch.Tensor]:
        if self.curve == "linear":
            return {n: (1 - t) * self.start[n] + t * self.end[n] for n in self.names}
        c1, cc, c2 = bezier_coefficients(t)
        if self.control is None:
            raise ValueError("a Bezier path needs its control point")
        middle = self.control.tensors()
        return {n: c1 * self.start[n] + cc * middle[n] + c2 * self.end[n] for n in self.names}

    @torch.no_grad()
    def ensemble(self, count: int) -> dict[str, torch.Tensor]:
        """The MCU ensemble: the weight average at `count` evenly spaced interior points."""
        ts = [(i + 1) / (count + 1) for i in range(count)]
        total = {n: torch.zeros_like(self.start[n]) for n in self.names}
        for t in ts:
            for n, w in self.weights(t).items():
                total[n] += w.detach()
        return {n: v / count for n, v in total.items()}


@torch.no_grad()
def load_weights(model, weights: dict[str, torch.Tensor]) -> None:
    """Write weights into the model in place (for generation, which functional_call cannot drive)."""
    own = dict(model.named_parameters())
    for name, value in weights.items():
        own[name].copy_(value)
