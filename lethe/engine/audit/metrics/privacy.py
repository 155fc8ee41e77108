"""Membership inference (SPEC section 5): LOSS, zlib, Min-K% and Min-K%++ scores (higher = more
member-like), ROC-AUC of members (forget) against non-members (holdout), and PrivLeak."""
from __future__ import annotations

import zlib

from lethe.engine.audit.metrics.forward import TokenStats

MIN_K = 0.4


def _lowest_mean(values: list[float], fraction: float) -> float:
    k = max(1, int(len(values) * fraction))
    return sum(sorted(values)[:k]) / k


def attack_scores(stats: TokenStats, text: str) -> dict[str, float]:
    mean_nll = stats.nll_sum / stats.n
    return {
        "loss": -mean_nll,
        # Carlini et al.: the mean token loss over the zlib-compressed length of the text.
        "zlib": -mean_nll / len(zlib.compress(text.encode("utf-8"))),
        "min_k": _lowest_mean(stats.logprobs, MIN_K),
        "min_k_pp": _lowest_mean(stats.zscores, MIN_K),
    }


def roc_auc(members: list[float], non_members: list[float]) -> float:
    """P(score of a member > score of a non-member), ties counting half (Mann-Whitney U / n m)."""
    ranked = sorted([(s, 1) for s in members] + [(s, 0) for s in non_members])
    rank_sum, i = 0.0, 0
    while i < len(ranked):  # average ranks over ties
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        average_rank = (i + 1 + j) / 2
        rank_sum += average_rank * sum(label for _, label in ranked[i:j])
        i = j
    n, m = len(members), len(non_members)
    return (rank_sum - n * (n + 1) / 2) / (n * m)


def muse_auc(attack_auc: float) -> float:
    """MUSE's AUC: P(a forget record looks less like a member than a holdout record), the complement of
    the attack's AUC (ties count half in both, so the two add up to 1)."""
    return 1.0 - attack_auc


def privleak(auc_model: float, auc_reference: float) -> float:
    """MUSE: (AUC_model - AUC_ref) / AUC_ref * 100 on MUSE's AUCs. A model that still memorises the forget
    set scores near -100, one that looks like a retrain 0, one unlearned past a retrain positive."""
    return (auc_model - auc_reference) / auc_reference * 100
