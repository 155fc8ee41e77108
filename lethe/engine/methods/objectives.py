"""The baselines' objectives (SPEC section 4) as pure functions of logits and labels, so that each can
be checked by hand. The method modules (issue 5, in progress) wrap them around a policy forward pass.
NLL_f is the token-mean answer NLL on forget; sequence sums are over answer (active) tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lethe.engine.methods.masc.margin import active_positions, token_nll


def sequence_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: the summed log-probability of its active tokens, and how many there are."""
    z, y, rows = active_positions(logits, labels)
    token_lp = F.log_softmax(z.float(), dim=-1).gather(1, y[:, None]).squeeze(1)
    n = labels.shape[0]
    sums = torch.zeros(n, dtype=token_lp.dtype, device=token_lp.device).index_add(0, rows, token_lp)
    counts = torch.zeros(n, dtype=token_lp.dtype, device=token_lp.device).index_add(0, rows, torch.ones_like(token_lp))
    return sums, counts


def weighted(forget_term: torch.Tensor, forget_weight: float, retain_term: torch.Tensor | None,
             retain_weight: float) -> tuple[torch.Tensor, dict]:
    """forget_weight * L_f (+ retain_weight * L_r), and the parts as plain numbers for the trace."""
    total, parts = forget_weight * forget_term, {"forget": forget_term.item()}
    if retain_term is not None:
        total = total + retain_weight * retain_term
        parts["retain"] = retain_term.item()
    return total, {**parts, "total": total.item()}


def retain_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return token_nll(*active_positions(logits, labels)[:2])


def gradient_ascent(forget_logits, forget_labels) -> torch.Tensor:
    """GA: minimise -NLL_f."""
    return -token_nll(*active_positions(forget_logits, forget_labels)[:2])


def grad_diff(forget_logits, forget_labels, retain_logits, retain_labels, gamma=1.0, alpha=1.0) -> torch.Tensor:
    """GradDiff: -gamma NLL_f + alpha NLL_r."""
    return gamma * gradient_ascent(forget_logits, forget_labels) + alpha * retain_nll(retain_logits, retain_labels)


def npo(forget_logits, ref_forget_logits, forget_labels, beta=0.1) -> torch.Tensor:
    """NPO: -(2/beta) log sigmoid(-beta (log pi_theta(y|x) - log pi_ref(y|x))), summed sequence
    log-probs, averaged over sequences. Equals (2/beta) log 2 where pi_theta = pi_ref."""
    theta, _ = sequence_logprobs(forget_logits, forget_labels)
    ref, _ = sequence_logprobs(ref_forget_logits, forget_labels)
    return (-(2 / beta) * F.logsigmoid(-beta * (theta - ref.detach()))).mean()


def simnpo(forget_logits, forget_labels, beta=4.5, delta=0.0) -> torch.Tensor:
    """SimNPO: -(2/beta) log sigmoid(beta (NLL_sum/|y| - delta)); no reference model."""
    sums, counts = sequence_logprobs(forget_logits, forget_labels)
    return (-(2 / beta) * F.logsigmoid(beta * (-sums / counts - delta))).mean()


def masked_mse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over hidden dimensions, averaged over the tokens the mask keeps."""
    per_token = (a.float() - b.float()).pow(2).mean(-1)
    return (per_token * mask).sum() / mask.sum()


def rmu(forget_hidden, forget_mask, control, retain_hidden, ref_retain_hidden, retain_mask, alpha=100.0):
    """RMU: MSE of forget hidden states to c*u, plus alpha * MSE of retain hidden states to the
    reference's, both over the tokens the attention mask keeps (mean over tokens and dimensions)."""
    forget_term = masked_mse(forget_hidden, control.expand_as(forget_hidden), forget_mask)
    retain_term = masked_mse(retain_hidden, ref_retain_hidden.detach(), retain_mask)
    return forget_term + alpha * retain_term, forget_term, retain_term
