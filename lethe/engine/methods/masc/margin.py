"""The MASC quantities of SPEC section 3, on the logits of one forward pass.

Everything works on the active positions only: [N, V] rows gathered once from [B, T, V] logits,
so the top-k and logsumexp over the vocabulary run on what is scored and nothing else.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lethe.engine.data.records import IGNORE


def tau(rho: float) -> float:
    """Threshold on the restricted margin: m <= tau iff the restricted gold probability <= rho."""
    return math.log(rho / (1 - rho))


def active_positions(logits: torch.Tensor, labels: torch.Tensor):
    """Logits [N, V] at positions whose next token is active, the targets [N], their row index [N]."""
    shifted_labels = labels[:, 1:]
    mask = shifted_labels != IGNORE
    rows = mask.nonzero(as_tuple=True)[0]
    return logits[:, :-1][mask], shifted_labels[mask], rows


def active_values(values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A per-position [B, T] tensor read at the active positions, in active_positions' order ([N])."""
    return values[:, 1:][labels[:, 1:] != IGNORE]


def self_alternatives(logits: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [N, k'] of the k highest-logit non-gold tokens (k' = min(k, V - 1)); a discrete choice."""
    k = min(k, logits.shape[-1] - 1)
    without_gold = logits.detach().scatter(1, targets[:, None], float("-inf"))
    return without_gold.topk(k, dim=-1).indices


def teacher_alternatives(ref_logits: torch.Tensor, targets: torch.Tensor, k: int, delta: float):
    """theta_0's k best non-gold tokens, and which lie within delta logits of its best one."""
    k = min(k, ref_logits.shape[-1] - 1)
    without_gold = ref_logits.detach().float().scatter(1, targets[:, None], float("-inf"))
    values, indices = without_gold.topk(k, dim=-1)
    keep = values >= values[:, :1] - delta
    return indices, keep


def restricted_margin(logits: torch.Tensor, targets: torch.Tensor, alt_indices: torch.Tensor,
                      alt_keep: torch.Tensor | None = None, beta: float = 1.0) -> torch.Tensor:
    """m_t = beta z(y_t) - logsumexp_{v in S_k} beta z(v), gradients through the chosen logits."""
    gold = logits.gather(1, targets[:, None]).squeeze(1).float()
    alternatives = logits.gather(1, alt_indices).float()
    if alt_keep is not None:
        alternatives = alternatives.masked_fill(~alt_keep, float("-inf"))
    return beta * gold - torch.logsumexp(beta * alternatives, dim=-1)


def buffered_hinge(margin: torch.Tensor, tau_value: float | torch.Tensor, eta: float) -> torch.Tensor:
    """h_t = relu(m_t - (tau - eta)) / eta: >= 1[m_t > tau], zero once a token is suppressed."""
    return F.relu(margin - (tau_value - eta)) / eta


def sequence_means(values: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Mean of per-position values within each sequence ([N] -> [n_rows])."""
    total = torch.zeros(n_rows, dtype=torch.float32, device=values.device).index_add_(0, rows, values.float())
    count = torch.zeros(n_rows, dtype=torch.float32, device=values.device).index_add_(
        0, rows, torch.ones_like(values, dtype=torch.float32))
    return total / count.clamp(min=1)


# Within the greedy margin a trailing token counts as said only if it is this likely: on a flat distribution (an
# untrained model, 1/V everywhere) every token lies within a logit of the argmax, yet nothing is reproduced, and no
# suppression can open a one-logit gap there (a random model never met the rule, issue 24).
NEAR_ARGMAX_FLOOR = 0.05


def said_greedily(logits: torch.Tensor, targets: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """Per active row: whether greedy decoding may say the target here: it is the argmax (margin 0), or trails the
    argmax by less than `margin` logits with probability at least NEAR_ARGMAX_FLOOR (a token that close can come
    back from rounding in another dtype)."""
    argmax = logits.argmax(-1) == targets
    if margin <= 0:
        return argmax
    z = logits.float()
    likely = F.log_softmax(z, dim=-1).gather(1, targets[:, None])[:, 0] >= math.log(NEAR_ARGMAX_FLOOR)
    return argmax | ((argmax_gap(z, targets) > -margin) & likely)


def secret_spans(logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, span: torch.Tensor,
                 is_secret: torch.Tensor, n_rows: int, margin: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, over its content spans (positions with is_secret, numbered by `span`): the largest
    probability p(span | the text before it) = prod_t p(y_t | c_t), the chance that sampling at
    temperature 1 says that span whole, and whether some span is greedy-decoded whole (every one of
    its tokens said greedily, see said_greedily). Both given the true text before each token; (0, False)
    without spans."""
    if not bool(is_secret.any()):
        zeros = torch.zeros(n_rows, device=logits.device)
        return zeros, zeros.bool()
    z, y = logits[is_secret].float(), targets[is_secret]
    width = int(span[is_secret].max()) + 1
    group = rows[is_secret] * width + span[is_secret]
    log_p = F.log_softmax(z, dim=-1).gather(1, y[:, None]).squeeze(1)
    hits = said_greedily(z, y, margin).float()
    size = n_rows * width
    total = torch.zeros(size, device=z.device).index_add_(0, group, log_p)
    count = torch.zeros(size, device=z.device).index_add_(0, group, torch.ones_like(log_p))
    argmax = torch.zeros(size, device=z.device).index_add_(0, group, hits)
    present = count > 0
    probability = torch.where(present, total.exp(), torch.zeros_like(total)).view(n_rows, width).max(1).values
    greedy = (present & (argmax == count)).view(n_rows, width).any(1)
    return probability, greedy


def sequence_violation(margin: torch.Tensor, rows: torch.Tensor, n_rows: int, tau_value: float) -> torch.Tensor:
    """v_i: the fraction of sequence i's active positions with m_t > tau."""
    return sequence_means((margin > tau_value).float(), rows, n_rows)


def sequence_reproduced(logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, n_rows: int,
                        margin: float = 0.0, counted: torch.Tensor | None = None) -> torch.Tensor:
    """r_i: True where every counted active token of sequence i is said greedily under teacher forcing (the argmax,
    or within `margin` logits of it), i.e. where greedy decoding gives the sequence back word for word (or could,
    after rounding). `counted`: the rows that count ([N] bool; None: all); the end-of-sequence token does not,
    since flipping it alone leaves every word of the record said."""
    hits = said_greedily(logits, targets, margin)
    if counted is not None:
        hits = hits | ~counted
    return sequence_means(hits.float(), rows, n_rows) >= 1.0


def without(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Logits [N, V] with each row's target token taken out (a large negative logit: softmax gives it 0)."""
    return logits.float().scatter(1, targets[:, None], -1e4)


def masked_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Token-mean KL(pi_0 || pi_theta) over the full vocabulary, on active rows [N, V] only. Reference
    logits of -inf (a token pi_0 is denied) contribute nothing, as 0 log 0 = 0."""
    log_p = F.log_softmax(logits.float(), dim=-1)
    p0 = F.softmax(ref_logits.float(), dim=-1)
    return F.kl_div(log_p, p0, reduction="none").sum(-1).mean()


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Token-mean NLL on active rows."""
    return F.cross_entropy(logits.float(), targets)


def argmax_gap(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per active row: the target's logit minus the largest other logit (> 0: greedy decoding says it)."""
    return logits.float().gather(1, targets[:, None])[:, 0] - without(logits, targets).max(-1).values


def kept_argmax_hinge(logits: torch.Tensor, ref_logits: torch.Tensor, targets: torch.Tensor,
                      gap: float) -> torch.Tensor:
    """Token-mean relu(min(gap, g_0) - g) with g the target's argmax gap under pi_theta and g_0 under pi_0:
    zero while each retain token stays as far ahead as theta_0 had it, up to `gap` logits. A KL averaged
    over every token barely notices the one token whose flip breaks a namesake's answer; this does."""
    return held_argmax_hinge(logits, targets, torch.clamp(argmax_gap(ref_logits, targets), max=gap).detach())


def held_argmax_hinge(logits: torch.Tensor, targets: torch.Tensor, gap: float | torch.Tensor) -> torch.Tensor:
    """Token-mean relu(gap - g), g the target's argmax gap under pi_theta (`gap`: one for all, or per token): zero
    while each held token leads by `gap` logits (a greedy answer at a near tie flips under the smallest update; held
    by a margin, it does not)."""
    return F.relu(gap - argmax_gap(logits, targets)).mean()


def centred_logit_drift(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """sum_t ||c(z_t) - c(z0_t)||^2 / sum_t ||c(z0_t)||^2 over active rows [N, V], c(z) = z minus its mean over the
    vocabulary: how far the logits moved, relative to theta_0's own spread. Zero at theta_0; a constant added to a
    row (which leaves its distribution as it is) moves nothing; scale-free across models. KL(pi_0 || pi_theta)
    weighs each token by pi_0, so on a memorised answer it hardly sees the logits below the argmax, and their drift is
    what brings the next-best token up to the gold (issue 28). Columns where z0 is -inf (denied) are left out."""
    z0, z = ref_logits.detach().float(), logits.float()
    kept = torch.isfinite(z0)
    if kept.all():  # the usual case, with fewer [N, V] copies
        c0 = z0 - z0.mean(-1, keepdim=True)
        return (z - z.mean(-1, keepdim=True) - c0).pow(2).sum() / c0.pow(2).sum().clamp(min=1e-12)
    c0, c = centred(z0, kept).masked_fill(~kept, 0.0), centred(z, kept).masked_fill(~kept, 0.0)
    return (c - c0).pow(2).sum() / c0.pow(2).sum().clamp(min=1e-12)


def centred(logits: torch.Tensor, kept: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 rows minus their mean over the `kept` entries (default: the finite ones; a -inf, a denied token, stays
    -inf). Gradients pass: the logit drift centres the trained logits with it."""
    z = logits.float()
    kept = torch.isfinite(z) if kept is None else kept
    return z - torch.where(kept, z, torch.zeros_like(z)).sum(-1, keepdim=True) / kept.sum(-1, keepdim=True).clamp(min=1)


def lineage_reference(anchor_logits: torch.Tensor, start_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The retain term's reference on active rows [N, V] when a run starts from a later version of the anchor's
    lineage (issue 28). A row where the start gives the target less probability than the anchor (it drifted): the
    anchor's centred logit for the target, the lower of the anchor's and the start's for every other token, so the
    retain record is pulled back to what the anchor said of it and no other token above where the start has it. Any
    other row: the start's own. The anchor still knows what earlier runs of the lineage erased; pulling every row to
    it brought an earlier set's secret back on the chain (BENCHMARKS.md, "Which rows the anchor pulls")."""
    anchor, start = centred(anchor_logits.detach()), centred(start_logits.detach())
    mixed = torch.minimum(anchor, start).scatter(1, targets[:, None], anchor.gather(1, targets[:, None]))
    # A row whose target the start holds at least as surely as the anchor has not drifted: it keeps the start's own
    # row, and nothing there pulls towards what the anchor knows.
    t = targets[:, None]
    held = (F.log_softmax(start, -1).gather(1, t) >= F.log_softmax(anchor, -1).gather(1, t))
    return torch.where(held, start, mixed)


def target_divergence(logits: torch.Tensor, target_ids: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Token-mean KL(q_t || pi_theta) for sparse targets ([N, K] ids and probabilities, each row summing to 1):
    sum_k q_k (log q_k - log pi_theta(v_k | c_t)); tokens outside a row's ids have q = 0 and add nothing."""
    log_pi = F.log_softmax(logits.float(), dim=-1).gather(1, target_ids)
    q = target_probs.float()
    log_q = torch.where(q > 0, q.clamp(min=1e-30).log(), torch.zeros_like(q))
    return (q * (log_q - log_pi)).sum(-1).mean()
