"""Forget quality: the two-sample Kolmogorov-Smirnov p-value between the per-record forget truth
ratios of a model and of its retrain reference (SPEC section 5)."""
from __future__ import annotations

from scipy.stats import ks_2samp


def ks_p_value(sample: list[float], reference: list[float]) -> float:
    # "exact" where scipy can (small samples), as TOFU's forget quality uses the same test.
    return float(ks_2samp(sample, reference, method="auto").pvalue)
