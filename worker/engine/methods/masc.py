"""MASC: buffered-hinge margin suppression on forget tokens, KL(pi_0 || pi_theta) on retain tokens."""
from __future__ import annotations

import torch

from worker.engine import margin as M
from worker.engine.loading import Policy, autocast
from worker.engine.params import MascParams
from worker.engine.records import Batch, EncodedRecord, batches, concat_batches
from worker.engine.stop_rule import RecordCheck


class Masc:
    name = "masc"

    def __init__(self, params: MascParams, policy: Policy, pad_id: int):
        self.params = params
        self.policy = policy
        self.pad_id = pad_id
        self.tau = params.tau
        self.forget_weight = params.lambda_forget  # the loop may raise it when the rule stops making progress
        # (v_i, L_i, r_i, h_i) of the forget rows of the last training batch, measured on the weights before
        # its step: the stop rule's per-record state, refreshed for free by every training forward pass.
        self.last_forget_measurement: tuple[torch.Tensor, ...] | None = None

    def _margins(self, logits: torch.Tensor, batch: Batch):
        """Restricted margins at the batch's active positions, each position's row, its logits and target."""
        z, y, rows = M.active_positions(logits, batch.labels)
        p = self.params
        if p.alternatives == "teacher":
            z0, _, _ = M.active_positions(self.policy.reference_logits(batch), batch.labels)
            indices, keep = M.teacher_alternatives(z0, y, p.k, p.delta)
        else:
            indices, keep = M.self_alternatives(z, y, p.k), None
        return M.restricted_margin(z, y, indices, keep, p.beta), rows, z, y

    def _measure(self, margins, rows, z, y, n: int):
        """Per sequence: v_i, the number of active tokens L_i, r_i (greedy decoding reproduces it) and the
        mean buffered hinge h_i."""
        counts = torch.zeros(n, device=rows.device).index_add_(0, rows, torch.ones_like(margins))
        hinge = M.sequence_means(M.buffered_hinge(margins, self.tau, self.params.eta), rows, n)
        return (M.sequence_violation(margins, rows, n, self.tau), counts,
                M.sequence_reproduced(z, y, rows, n), hinge)

    def loss(self, forget: Batch | None, retain: Batch | None):
        """lambda_retain * L_retain + forget_weight * L_forget, from one policy forward pass. With no forget
        batch (every forget record already meets the rule) only the retain term: a repair step."""
        p = self.params
        if forget is None:
            return self._retain_only(retain)
        joint = concat_batches(forget, retain, self.pad_id) if retain is not None else forget
        logits = self.policy.logits(joint)
        n_forget = len(forget)
        forget_rows = Batch(joint.input_ids[:n_forget], joint.attention_mask[:n_forget], joint.labels[:n_forget])
        margins, rows, z, y = self._margins(logits[:n_forget], forget_rows)
        with torch.no_grad():
            self.last_forget_measurement = self._measure(margins.detach(), rows, z.detach(), y, n_forget)
        forget_loss = M.buffered_hinge(margins, self.tau, p.eta).mean()
        total = self.forget_weight * forget_loss
        parts = {"forget": forget_loss.item()}
        if retain is not None and p.lambda_retain > 0:
            retain_loss = self._retain_term(logits[n_forget:], joint.labels[n_forget:], retain)
            total = total + p.lambda_retain * retain_loss
            parts["retain"] = retain_loss.item()
        parts["total"] = total.item()
        return total, parts

    @torch.no_grad()
    def sequence_violations(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """Per sequence: the violation fraction v_i, the number of active tokens L_i, r_i and h_i."""
        margins, rows, z, y = self._margins(self.policy.logits(batch), batch)
        return self._measure(margins, rows, z, y, len(batch))

    def _retain_term(self, logits: torch.Tensor, labels: torch.Tensor, retain: Batch) -> torch.Tensor:
        z, y, _ = M.active_positions(logits, labels)
        if self.params.retain_loss == "kl":
            # Right padding only, so retain's own batch yields the same active rows in the same order.
            z0, _, _ = M.active_positions(self.policy.reference_logits(retain), retain.labels)
            return M.masked_kl(z0, z)
        return M.token_nll(z, y)

    def _retain_only(self, retain: Batch):
        self.last_forget_measurement = None
        retain_loss = self._retain_term(self.policy.logits(retain), retain.labels, retain)
        total = self.params.lambda_retain * retain_loss
        return total, {"forget": 0.0, "retain": retain_loss.item(), "total": total.item()}

    def check_records(self, records: list[EncodedRecord], batch_size: int) -> list[RecordCheck]:
        """The stop rule's measurement of each record: v_i, L_i, r_i."""
        device = next(self.policy.model.parameters()).device
        out = []
        with autocast(device):
            for start in range(0, len(records), batch_size):
                chunk = records[start:start + batch_size]
                measured = self.sequence_violations(next(batches(chunk, batch_size, self.pad_id)).to(device))
                out += checks_of(chunk, measured)
        return out


def checks_of(records: list[EncodedRecord], measured: tuple[torch.Tensor, ...]) -> list[RecordCheck]:
    """RecordChecks from the per-sequence tensors (v, L, r, h) of a batch of these records."""
    v, counts, reproduced, hinge = (t.tolist() for t in measured)
    return [RecordCheck(r.id, float(vi), int(n), bool(ri), float(hi))
            for r, vi, n, ri, hi in zip(records, v, counts, reproduced, hinge)]
