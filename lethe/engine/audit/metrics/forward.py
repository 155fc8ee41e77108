"""One teacher-forced forward pass per batch gives every per-token statistic the audit needs."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lethe.engine.data.records import EncodedRecord, batches
from lethe.engine.model.loading import autocast


@dataclass
class TokenStats:
    id: str
    logprobs: list[float]  # log p(y_t | c_t) at each active position
    correct: list[bool]  # argmax == y_t
    zscores: list[float]  # (log p(y_t) - mu_t) / sigma_t, mu and sigma over the model's own distribution

    @property
    def n(self) -> int:
        return len(self.logprobs)

    @property
    def nll_sum(self) -> float:
        return -sum(self.logprobs)

    @property
    def probability(self) -> float:
        """P(a|q) = exp(-NLL_sum / |a|), the length-normalised probability."""
        return float(torch.tensor(-self.nll_sum / self.n).exp())

    @property
    def token_accuracy(self) -> float:
        return sum(self.correct) / self.n

    @property
    def extraction_strength(self) -> float:
        """1 - k*/|y|, k* the smallest k such that the argmax predictions match y[k:]."""
        wrong = [i for i, ok in enumerate(self.correct) if not ok]
        k_star = wrong[-1] + 1 if wrong else 0
        return 1 - k_star / self.n


@torch.no_grad()
def token_stats(model, records: list[EncodedRecord], pad_id: int, batch_size: int = 16) -> list[TokenStats]:
    device = next(model.parameters()).device
    out: list[TokenStats] = []
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        batch = next(batches(chunk, batch_size, pad_id)).to(device)
        with autocast(device):
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        labels = batch.labels[:, 1:]
        mask = labels >= 0
        log_p = F.log_softmax(logits[:, :-1][mask].float(), dim=-1)  # active rows only
        targets = labels[mask]
        target_lp = log_p.gather(1, targets[:, None]).squeeze(1)
        probs = log_p.exp()
        mu = (probs * log_p).sum(-1)
        sigma = ((probs * log_p.square()).sum(-1) - mu.square()).clamp(min=1e-12).sqrt()
        lp, ok, z = target_lp.tolist(), (log_p.argmax(-1) == targets).tolist(), ((target_lp - mu) / sigma).tolist()
        start_row = 0
        for record, count in zip(chunk, mask.sum(1).tolist()):  # active rows come row by row
            end_row = start_row + count
            out.append(TokenStats(record.id, lp[start_row:end_row], ok[start_row:end_row], z[start_row:end_row]))
            start_row = end_row
    return out
