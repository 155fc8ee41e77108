"""Truth ratio (SPEC section 5): TR = geomean_j P(perturbed_j) / P(paraphrased_completion), with
P(a|q) = exp(-NLL_sum(a|q) / |a|). Forget sets report mean(min(TR, 1/TR)); retain and utility sets
mean(max(0, 1 - TR))."""
from __future__ import annotations

import math

from lethe.engine.audit.metrics import metric


def truth_ratio(log_p_paraphrased: float, log_p_perturbed: list[float]) -> float:
    """From length-normalised log-probabilities (log P = -NLL_sum / |a|)."""
    return math.exp(sum(log_p_perturbed) / len(log_p_perturbed) - log_p_paraphrased)


def forget_score(ratios: dict[str, float]) -> dict:
    return metric({k: min(tr, 1 / tr) for k, tr in ratios.items()})


def retain_score(ratios: dict[str, float]) -> dict:
    return metric({k: max(0.0, 1 - tr) for k, tr in ratios.items()})
