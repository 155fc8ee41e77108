"""MASC: buffered-hinge margin suppression on forget tokens, KL(pi_0 || pi_theta) on retain tokens."""
from __future__ import annotations

import torch

from worker.engine import margin as M
from worker.engine.loading import Policy
from worker.engine.params import MascParams
from worker.engine.records import Batch, concat_batches


class Masc:
    name = "masc"

    def __init__(self, params: MascParams, policy: Policy, pad_id: int):
        self.params = params
        self.policy = policy
        self.pad_id = pad_id
        self.tau = params.tau

    def _margins(self, logits: torch.Tensor, batch: Batch):
        """Restricted margins at the batch's active positions, and each position's row."""
        z, y, rows = M.active_positions(logits, batch.labels)
        p = self.params
        if p.alternatives == "teacher":
            z0, _, _ = M.active_positions(self.policy.reference_logits(batch), batch.labels)
            indices, keep = M.teacher_alternatives(z0, y, p.k, p.delta)
        else:
            indices, keep = M.self_alternatives(z, y, p.k), None
        return M.restricted_margin(z, y, indices, keep, p.beta), rows

    def loss(self, forget: Batch, retain: Batch | None):
        """lambda_retain * L_retain + lambda_forget * L_forget, from one policy forward pass."""
        p = self.params
        joint = concat_batches(forget, retain, self.pad_id) if retain is not None else forget
        logits = self.policy.logits(joint)
        n_forget = len(forget)
        forget_rows = Batch(joint.input_ids[:n_forget], joint.attention_mask[:n_forget], joint.labels[:n_forget])
        margins, _ = self._margins(logits[:n_forget], forget_rows)
        forget_loss = M.buffered_hinge(margins, self.tau, p.eta).mean()
        total = p.lambda_forget * forget_loss
        parts = {"forget": forget_loss.item()}
        if retain is not None and p.lambda_retain > 0:
            z, y, _ = M.active_positions(logits[n_forget:], joint.labels[n_forget:])
            if p.retain_loss == "kl":
                # Right padding only, so retain's own batch yields the same active rows in the same order.
                z0, _, _ = M.active_positions(self.policy.reference_logits(retain), retain.labels)
                retain_loss = M.masked_kl(z0, z)
            else:
                retain_loss = M.token_nll(z, y)
            total = total + p.lambda_retain * retain_loss
            parts["retain"] = retain_loss.item()
        parts["total"] = total.item()
        return total, parts

    @torch.no_grad()
    def sequence_violations(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per sequence: the violation fraction v_i and the number of active tokens L_i."""
        margins, rows = self._margins(self.policy.logits(batch), batch)
        n = len(batch)
        counts = torch.zeros(n, device=rows.device).index_add_(0, rows, torch.ones_like(margins))
        return M.sequence_violation(margins, rows, n, self.tau), counts
