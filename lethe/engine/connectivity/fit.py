"""Training the Bezier control point (SPEC section 6): t ~ U(0, 1) per step, minimise
L_retain(phi(t)) + lambda_f * hinge_forget(phi(t)). The model's own weights stay untouched: phi(t) enters
through torch.func.functional_call, so gradients flow to theta_c and nowhere else."""
from __future__ import annotations

import random
import time

import torch
from torch.func import functional_call

from lethe.engine.connectivity.paths import Path
from lethe.engine.data.records import collate
from lethe.engine.methods.masc import margin as M
from lethe.engine.model.loading import autocast


def path_logits(model, path: Path, t: float, batch) -> torch.Tensor:
    return functional_call(model, path.weights(t), (),
                           {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False},
                           strict=False).logits


def path_loss(model, path: Path, t: float, forget, retain, params) -> tuple[torch.Tensor, dict]:
    """L_retain (token NLL) + lambda_forget * buffered hinge on forget tokens, at phi(t)."""
    total: float | torch.Tensor = 0.0
    parts: dict[str, float] = {}
    if retain is not None:
        z, y, _ = M.active_positions(path_logits(model, path, t, retain), retain.labels)
        retain_loss = M.token_nll(z, y)
        total, parts["retain"] = total + retain_loss, retain_loss.item()
    if forget is not None and params.lambda_forget > 0:
        z, y, _ = M.active_positions(path_logits(model, path, t, forget), forget.labels)
        margins = M.restricted_margin(z, y, M.self_alternatives(z, y, params.k), None, params.beta)
        hinge = M.buffered_hinge(margins, M.tau(params.rho), params.eta).mean()
        total, parts["forget_hinge"] = total + params.lambda_forget * hinge, hinge.item()
    if not isinstance(total, torch.Tensor):
        raise ValueError("a path step needs a retain batch or a forget term")
    return total, parts


def fit_control_point(model, tokenizer, path: Path, forget: list, retain: list, params,
                      should_cancel=None, progress=None) -> dict:
    """Adam on theta_c for params.fit_steps steps; returns the loss trace and the time taken."""
    if path.control is None:
        raise ValueError("only a Bezier path has a control point to fit")
    if not retain and not forget:
        raise ValueError("fitting the control point needs retain or forget records")
    device = next(model.parameters()).device
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:  # only theta_c learns; the model's own tensors need no gradient
        p.requires_grad_(False)
    rng = random.Random(params.seed)
    optimiser = torch.optim.Adam(path.control.parameters(), lr=params.fit_lr)
    pad, trace, started = tokenizer.pad_token_id, [], time.perf_counter()
    try:
        for step in range(1, params.fit_steps + 1):
            if should_cancel is not None and should_cancel():
                raise InterruptedError("cancelled")
            t = rng.random()
            pick = lambda records: (collate(rng.sample(records, min(params.batch_size, len(records))), pad).to(device)  # noqa: E731
                                    if records else None)
            with autocast(device):
                loss, parts = path_loss(model, path, t, pick(forget), pick(retain), params)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            trace.append({"step": step, "t": round(t, 4), **parts, "total": loss.item()})
            if progress is not None:
                progress({"fit_step": step, "fit_steps": params.fit_steps, "losses": parts})
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return {"steps": params.fit_steps, "seconds": time.perf_counter() - started, "loss_trace": trace}
