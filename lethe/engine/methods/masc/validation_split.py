"""D_val (SPEC section 3): the records the stop rule judges, every forget record (train mode, the default) or a seeded
holdout kept out of training (the MASC paper's setting)."""
from __future__ import annotations

import random

from lethe.engine.data.records import EncodedRecord
from lethe.engine.methods.masc.params import MascParams


def split_validation(forget: list[EncodedRecord], params: MascParams) -> tuple[list, list, dict]:
    """D_val: every forget record (train mode, the default), or a seeded holdout kept out of training."""
    n = len(forget)
    if params.val_mode == "train":
        return forget, forget, {"mode": "train", "n_train": n, "n_val": n}
    n_val = max(params.holdout_min, round(params.holdout_fraction * n))
    if n - n_val >= params.holdout_min:
        order = list(range(n))
        random.Random(params.seed).shuffle(order)
        val = [forget[i] for i in sorted(order[:n_val])]
        train = [forget[i] for i in sorted(order[n_val:])]
        return train, val, {"mode": "holdout", "n_train": len(train), "n_val": len(val),
                            "never_trained": [r.id for r in val]}
    return forget, forget, {"mode": "train", "n_train": n, "n_val": n,
                            "reason": f"forget set of {n} records is too small to hold out {n_val} and keep "
                                      f"{params.holdout_min} for training; D_val is the training forget set"}
