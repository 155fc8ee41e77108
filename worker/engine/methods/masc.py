"""MASC: buffered-hinge margin suppression on forget tokens, KL(pi_0 || pi_theta) on retain tokens.

With secrets located on a record (worker.engine.secret_spans), the forget term splits its tokens. At a
secret's tokens the hinge suppresses the true token and a redistribution term moves its mass to where
theta_0 itself would put it without that token (KL to theta_0 with the token taken out); the other
tokens, the template any model would say, are held at theta_0's distribution by a fluency KL. The
answer stays fluent and only the secret goes. A record with no located secret is suppressed as a whole,
as in the paper."""
from __future__ import annotations

import torch

from worker.engine import margin as M
from worker.engine.loading import Policy, autocast
from worker.engine.params import MascParams
from worker.engine.records import (
    LOOP,
    SECRET,
    SUPPRESS,
    TEMPLATE,
    Batch,
    EncodedRecord,
    batches,
    concat_batches,
)
from worker.engine.stop_rule import RecordCheck


class Masc:

    def __init__(self, params: MascParams, policy: Policy, pad_id: int):
        # run_unlearning decides secret focus from the request's records; without them, what is set.
        self.params = params.resolved(focused=params.secret_focus is True)
        self.policy = policy
        self.pad_id = pad_id
        self.tau = params.tau
        self.tau_secret = params.tau_secret
        self.forget_weight = params.lambda_forget  # the loop may raise it when the rule stops making progress
        # The per-sequence measurements (v, L, r, h, p, g) of the forget rows of the last training batch, on the
        # weights before its step: the stop rule's per-record state, refreshed for free by every training pass.
        self.last_forget_measurement: tuple[torch.Tensor, ...] | None = None

    def _margins(self, logits: torch.Tensor, batch: Batch, reference: torch.Tensor | None = None):
        """Restricted margins at the batch's active positions, each position's row, its logits, target and
        focus (TEMPLATE, SUPPRESS or SECRET)."""
        z, y, rows = M.active_positions(logits, batch.labels)
        p = self.params
        if p.alternatives == "teacher":
            reference = reference if reference is not None else self.policy.reference_logits(batch)
            z0, _, _ = M.active_positions(reference, batch.labels)
            indices, keep = M.teacher_alternatives(z0, y, p.k, p.delta)
        else:
            indices, keep = M.self_alternatives(z, y, p.k), None
        focus = M.active_values(batch.focus, batch.labels) if batch.focus is not None else torch.full_like(y, SUPPRESS)
        return M.restricted_margin(z, y, indices, keep, p.beta), rows, z, y, focus

    def _thresholds(self, focus: torch.Tensor) -> torch.Tensor:
        """tau, and tau_secret at a secret's tokens: there the restricted probability must fall to rho_secret,
        below 1/(k+1), where the true token can no longer be the argmax; the same at a loop's tokens."""
        return torch.where((focus >= SECRET) | (focus == LOOP), self.tau_secret, self.tau).float()

    def _measure(self, margins, rows, z, y, focus, n: int):
        """Per sequence: v_i, the number of active tokens L_i, r_i (greedy decoding reproduces it), the mean
        buffered hinge h_i over the tokens it suppresses, p_i the largest probability of one of its secrets
        given the text before it (0 without secrets), and g_i whether greedy decoding, given that text,
        would say some secret whole."""
        counts = torch.zeros(n, device=rows.device).index_add_(0, rows, torch.ones_like(margins))
        suppressed = focus != TEMPLATE
        hinge = M.buffered_hinge(margins, self._thresholds(focus), self.params.eta)
        probability, greedy = M.secret_spans(z, y, rows, focus - SECRET, focus >= SECRET, n)
        return (M.sequence_violation(margins, rows, n, self.tau), counts, M.sequence_reproduced(z, y, rows, n),
                M.sequence_means(hinge[suppressed], rows[suppressed], n), probability, greedy)

    def loss(self, forget: Batch | None, retain: Batch | None):
        """lambda_retain * L_retain + forget_weight * L_forget + lambda_fluency * L_fluency, from one policy
        forward pass. With no forget batch (every forget record already meets the rule) only the retain
        term: a repair step."""
        p = self.params
        if forget is None:
            if retain is None:
                raise ValueError("a step needs a forget or a retain batch")
            return self._retain_only(retain)
        joint = concat_batches(forget, retain, self.pad_id) if retain is not None else forget
        logits = self.policy.logits(joint)
        n_forget = len(forget)
        forget_rows = joint.rows(0, n_forget)

        def has(kind):
            return forget.focus is not None and bool((forget.focus >= SECRET).any() if kind == SECRET
                                                     else (forget.focus == kind).any())

        fluency_on = p.lambda_fluency > 0 and has(TEMPLATE)
        redistribute_on = p.redistribute_weight > 0 and has(SECRET)
        kl_on = retain is not None and p.retain_weight > 0 and p.retain_loss == "kl"
        # One no-grad pass of pi_0 serves the fluency and redistribution terms (forget rows) and the retain KL.
        reference = (self.policy.reference_logits(joint)
                     if fluency_on or redistribute_on or p.alternatives == "teacher" else None)
        margins, rows, z, y, focus = self._margins(logits[:n_forget], forget_rows,
                                                   reference[:n_forget] if reference is not None else None)
        with torch.no_grad():
            self.last_forget_measurement = self._measure(margins.detach(), rows, z.detach(), y, focus, n_forget)
        suppressed = focus != TEMPLATE
        hinge = M.buffered_hinge(margins, self._thresholds(focus), p.eta)
        forget_loss = hinge[suppressed].mean() if suppressed.any() else hinge.sum() * 0
        total = self.forget_weight * forget_loss
        parts = {"forget": forget_loss.item()}
        if fluency_on or redistribute_on:
            assert reference is not None  # computed above whenever either term is on
            z0, _, _ = M.active_positions(reference[:n_forget], forget_rows.labels)
        if fluency_on:
            template = focus == TEMPLATE
            fluency = M.masked_kl(z0[template], z[template])
            total = total + p.lambda_fluency * fluency
            parts["fluency"] = fluency.item()
        if redistribute_on:
            # The secret token's mass goes where theta_0 would put it without that token: fluent, and wrong.
            secret = focus >= SECRET
            redistribute = M.masked_kl(M.without(z0[secret], y[secret]), z[secret])
            total = total + p.redistribute_weight * redistribute
            parts["redistribute"] = redistribute.item()
        if retain is not None and p.retain_weight > 0:
            retain_reference = reference[n_forget:] if reference is not None and kl_on else None
            retain_loss = self._retain_term(logits[n_forget:], joint.labels[n_forget:], retain, retain_reference)
            total = total + p.retain_weight * retain_loss
            parts["retain"] = retain_loss.item()
        parts["total"] = total.item()
        return total, parts

    @torch.no_grad()
    def sequence_violations(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """Per sequence: v_i, L_i, r_i, h_i, p_i and g_i (see _measure)."""
        margins, rows, z, y, focus = self._margins(self.policy.logits(batch), batch)
        return self._measure(margins, rows, z, y, focus, len(batch))

    def _retain_term(self, logits: torch.Tensor, labels: torch.Tensor, retain: Batch,
                     reference: torch.Tensor | None = None) -> torch.Tensor:
        z, y, _ = M.active_positions(logits, labels)
        if self.params.retain_loss == "kl":
            # Right padding only, so retain's own batch yields the same active rows in the same order.
            if reference is None:
                reference, labels = self.policy.reference_logits(retain), retain.labels
            z0, _, _ = M.active_positions(reference, labels)
            kl = M.masked_kl(z0, z)
            if self.params.keep_weight > 0:
                return kl + self.params.keep_weight * M.kept_argmax_hinge(z, z0, y, self.params.keep_gap)
            return kl
        return M.token_nll(z, y)

    def _retain_only(self, retain: Batch):
        self.last_forget_measurement = None
        retain_loss = self._retain_term(self.policy.logits(retain), retain.labels, retain)
        total = self.params.retain_weight * retain_loss
        return total, {"forget": 0.0, "retain": retain_loss.item(), "total": total.item()}

    def check_records(self, records: list[EncodedRecord], batch_size: int) -> list[RecordCheck]:
        """The stop rule's measurement of each record."""
        device = next(self.policy.model.parameters()).device
        out = []
        with autocast(device):
            for start in range(0, len(records), batch_size):
                chunk = records[start:start + batch_size]
                measured = self.sequence_violations(next(batches(chunk, batch_size, self.pad_id)).to(device))
                out += checks_of(chunk, measured)
        return out


def checks_of(records: list[EncodedRecord], measured: tuple[torch.Tensor, ...]) -> list[RecordCheck]:
    """RecordChecks from the per-sequence tensors (v, L, r, h, p, g) of a batch of these records."""
    v, counts, reproduced, hinge, probability, greedy = (t.tolist() for t in measured)
    return [RecordCheck(r.id, float(vi), int(n), bool(ri), float(hi), float(pi), bool(gi))
            for r, vi, n, ri, hi, pi, gi in zip(records, v, counts, reproduced, hinge, probability, greedy)]
