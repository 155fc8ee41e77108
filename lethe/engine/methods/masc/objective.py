"""MASC: buffered-hinge margin suppression on forget tokens, KL(pi_0 || pi_theta) on retain tokens and, with
suppress "content" (the default), a destination for every forget token.

The forget rows carry a focus per token (lethe.engine.methods.masc.destination, lethe.engine.methods.masc.answers): the
hinge suppresses the tokens of a record's content (SECRET), the tokens where the model's own answer loops (LOOP) and
every token of a record without content or suppressed whole (SUPPRESS); TEMPLATE tokens are not suppressed. Where a
token has a target, its hinge's margin is taken against the target's mean logit (the destination), not the model's own
top-k. Every forget token that has a target q_t, suppressed or not, is moved towards it by

    KL(q_t || pi_theta) = sum_v q_t(v) (log q_t(v) - log pi_theta(v | c_t)),

q_t being theta_0's prediction (about someone else, where the token is suppressed) with the record's content at
zero: kept tokens stay where theta_0 has them, suppressed ones go where a model that never saw the record would put
them, and none goes to the record's content. The targets are computed once (and per replay refresh), so a step
needs no reference pass for the forget rows. With suppress "whole" (the paper's) no record has targets."""
from __future__ import annotations

import torch

from lethe.engine.data.records import (
    HELD,
    LOOP,
    SECRET,
    SUPPRESS,
    TEMPLATE,
    Batch,
    EncodedRecord,
    batches,
    concat_batches,
)
from lethe.engine.methods.masc import margin as M
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.stop_rule import RecordCheck
from lethe.engine.model.loading import TrainableModel, autocast


class Masc:

    def __init__(self, params: MascParams, trainable: TrainableModel, pad_id: int):
        self.params = params  # resolved (SharedParams.resolved): weights are numbers
        self.trainable = trainable
        self.pad_id = pad_id
        self.eos_id: int | None = None  # set by the stop policy: the end of sequence never counts in r_i
        self.tau = params.tau
        self.tau_content = params.tau_content
        self.forget_weight = params.lambda_forget  # the loop may raise it when the rule stops making progress
        # The per-sequence measurements (v, L, r, h, p, g) of the forget rows of the last training batch, on the
        # weights before its step: the stop rule's per-record state, refreshed for free by every training pass.
        self.last_forget_measurement: tuple[torch.Tensor, ...] | None = None

    def _margins(self, logits: torch.Tensor, batch: Batch, reference: torch.Tensor | None = None):
        """Restricted margins at the batch's active positions, each position's row, its logits, target and
        focus (TEMPLATE, SUPPRESS, SECRET or LOOP)."""
        z, y, rows = M.active_positions(logits, batch.labels)
        p = self.params
        if p.alternatives == "teacher":
            reference = reference if reference is not None else self.trainable.reference_logits(batch)
            z0, _, _ = M.active_positions(reference, batch.labels)
            indices, keep = M.teacher_alternatives(z0, y, p.k, p.delta)
        else:
            indices, keep = M.self_alternatives(z, y, p.k), None
        focus = M.active_values(batch.focus, batch.labels) if batch.focus is not None else torch.full_like(y, SUPPRESS)
        return M.restricted_margin(z, y, indices, keep, p.beta), rows, z, y, focus

    def _thresholds(self, focus: torch.Tensor) -> torch.Tensor:
        """tau, and tau_content at a content token or a loop's token: there the restricted probability must fall to
        rho_content, below 1/(k+1), where the true token can no longer be the argmax."""
        return torch.where((focus >= SECRET) | (focus == LOOP), self.tau_content, self.tau).float()

    def _measure(self, margins, rows, z, y, focus, n: int):
        """Per sequence: v_i, the number of active tokens L_i, r_i (greedy decoding says every token but the end of
        sequence, within greedy_margin), the mean buffered hinge h_i over the tokens it suppresses, p_i the largest
        probability of one of its content spans given the text before it (0 without), and g_i whether greedy
        decoding, given that text, would say some content span whole (within greedy_margin)."""
        margin = self.params.greedy_margin
        counts = torch.zeros(n, device=rows.device).index_add_(0, rows, torch.ones_like(margins))
        suppressed = focus != TEMPLATE
        hinge = M.buffered_hinge(margins, self._thresholds(focus), self.params.eta)
        probability, greedy = M.secret_spans(z, y, rows, focus - SECRET, focus >= SECRET, n, margin)
        counted = y != self.eos_id if self.eos_id is not None else None
        return (M.sequence_violation(margins, rows, n, self.tau), counts,
                M.sequence_reproduced(z, y, rows, n, margin, counted),
                M.sequence_means(hinge[suppressed], rows[suppressed], n), probability, greedy)

    def loss(self, forget: Batch | None, retain: Batch | None):
        """lambda_retain * L_retain + forget_weight * L_forget + lambda_target * L_target, from one policy forward
        pass. With no forget batch (every forget record already meets the rule) only the retain term: a repair
        step."""
        p = self.params
        if forget is None:
            if retain is None:
                raise ValueError("a step needs a forget or a retain batch")
            return self._retain_only(retain)
        joint = concat_batches(forget, retain, self.pad_id) if retain is not None else forget
        logits = self.trainable.logits(joint)
        n_forget = len(forget)
        forget_rows = joint.rows(0, n_forget)
        margins, rows, z, y, focus = self._margins(logits[:n_forget], forget_rows)
        with torch.no_grad():
            self.last_forget_measurement = self._measure(margins.detach(), rows, z.detach(), y, focus, n_forget)
        held = focus == HELD
        any_held = bool(held.any())  # one device sync a step, read twice below
        suppressed = (focus != TEMPLATE) & ~held
        targets = self._active_targets(forget_rows, z.device)
        if targets is not None and any_held:  # a held token keeps its argmax, not a target's distribution
            targets = (targets[0], targets[1].masked_fill(held[:, None], 0))
        hinge = M.buffered_hinge(self._destination_margins(margins, z, y, targets), self._thresholds(focus), p.eta)
        forget_loss = hinge[suppressed].mean() if suppressed.any() else hinge.sum() * 0
        total = self.forget_weight * forget_loss
        parts = {"forget": forget_loss.item()}
        if p.lambda_target > 0 and targets is not None:
            target = self._target_term(z, *targets)
            if target is not None:
                total = total + p.lambda_target * target
                parts["target"] = target.item()
        if any_held and p.keep_weight > 0:
            # Each held token (a closed record's clean answer) stays the argmax by keep_gap logits, as a retain token
            # is kept: an answer nobody trains any more flips at a near tie while the others train.
            held_loss = M.held_argmax_hinge(z[held], y[held], p.keep_gap)
            total = total + p.keep_weight * held_loss
            parts["held"] = held_loss.item()
        if retain is not None and p.retain_weight > 0:
            retain_loss = self._retain_term(logits[n_forget:], joint.labels[n_forget:], retain)
            total = total + p.retain_weight * retain_loss
            parts["retain"] = retain_loss.item()
        parts["total"] = total.item()
        return total, parts

    @staticmethod
    def _active_targets(batch: Batch, device: torch.device | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The sparse targets at the active positions ([N, K] ids and probabilities; all 0: none) on the logits'
        device (a sharded model's last), read once per step for the hinge and the KL; None when the batch has none."""
        if batch.target_ids is None or batch.target_probs is None:
            return None
        return (M.active_values(batch.target_ids, batch.labels).to(device),
                M.active_values(batch.target_probs, batch.labels).to(device))

    def _destination_margins(self, margins: torch.Tensor, z: torch.Tensor, y: torch.Tensor,
                             targets: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """The margins the hinge trains on. Where a position has a target q, the gold logit against q's mean logit,

            m_t = beta (z(y_t) - sum_v q_t(v) z(v)),

        whose gradient raises each token by q_t(v): exactly the destination. Against the model's own top-k (or q's
        top-k through a logsumexp) it raised whatever the model already ranked highest, and at "works as a" that was
        the full stop ("works as a.", where q put 0.65 on another occupation and 0.03 on the stop). The stop rule
        measures with the model's own alternatives (see _margins)."""
        if targets is None:
            return margins
        ids, probs = targets
        probs = probs.float().masked_fill(ids == y[:, None], 0)
        mass = probs.sum(-1, keepdim=True)
        has = mass.squeeze(-1) > 0
        if not bool(has.any()):
            return margins
        expected = (z.gather(1, ids).float() * probs / mass.clamp(min=1e-30)).sum(-1)
        gold = z.gather(1, y[:, None]).squeeze(1).float()
        return torch.where(has, self.params.beta * (gold - expected), margins)

    @staticmethod
    def _target_term(z: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor) -> torch.Tensor | None:
        """KL to the targets, over the active positions that have one."""
        has = probs.sum(-1) > 0
        if not bool(has.any()):
            return None
        return M.target_divergence(z[has], ids[has], probs[has])

    @torch.no_grad()
    def sequence_violations(self, batch: Batch, model=None) -> tuple[torch.Tensor, ...]:
        """Per sequence: v_i, L_i, r_i, h_i, p_i and g_i (see _measure), of the policy or of `model` (a merged copy)."""
        logits = self.trainable.logits(batch) if model is None else \
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        margins, rows, z, y, focus = self._margins(logits, batch)
        return self._measure(margins, rows, z, y, focus, len(batch))

    def _retain_term(self, logits: torch.Tensor, labels: torch.Tensor, retain: Batch) -> torch.Tensor:
        z, y, _ = M.active_positions(logits, labels)
        if self.params.retain_loss == "kl":
            # Right padding only, so retain's own batch yields the same active rows in the same order.
            z0, _, _ = M.active_positions(self.trainable.anchor_logits(retain), retain.labels)
            if self.trainable.anchor is not None:
                start, _, _ = M.active_positions(self.trainable.reference_logits(retain), retain.labels)
                z0 = M.lineage_reference(z0, start, y)
            term = M.masked_kl(z0, z)
            if self.params.keep_weight > 0:
                term = term + self.params.keep_weight * M.kept_argmax_hinge(z, z0, y, self.params.keep_gap)
            if self.params.logits_weight > 0:
                term = term + self.params.logits_weight * M.centred_logit_drift(z, z0)
            return term
        return M.token_nll(z, y)

    def _retain_only(self, retain: Batch):
        self.last_forget_measurement = None
        retain_loss = self._retain_term(self.trainable.logits(retain), retain.labels, retain)
        total = self.params.retain_weight * retain_loss
        return total, {"forget": 0.0, "retain": retain_loss.item(), "total": total.item()}

    def check_records(self, records: list[EncodedRecord], batch_size: int, model=None) -> list[RecordCheck]:
        """The stop rule's measurement of each record, on the policy or on `model` (a merged copy)."""
        device = next((model or self.trainable.model).parameters()).device
        out = []
        with autocast(device):
            for start in range(0, len(records), batch_size):
                chunk = records[start:start + batch_size]
                measured = self.sequence_violations(next(batches(chunk, batch_size, self.pad_id)).to(device), model)
                out += checks_of(chunk, measured)
        return out


def checks_of(records: list[EncodedRecord], measured: tuple[torch.Tensor, ...]) -> list[RecordCheck]:
    """RecordChecks from the per-sequence tensors (v, L, r, h, p, g) of a batch of these records."""
    v, counts, reproduced, hinge, probability, greedy = (t.tolist() for t in measured)
    return [RecordCheck(r.id, float(vi), int(n), bool(ri), float(hi), float(pi), bool(gi))
            for r, vi, n, ri, hi, pi, gi in zip(records, v, counts, reproduced, hinge, probability, greedy)]
