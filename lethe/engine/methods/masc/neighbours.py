"""The retain records most at risk: those most like the forget set (shared names, shared rare words).

Suppressing "Okafor" after "The phone number of Hugo" also pulls at "The phone number of Ines Okafor";
a model retrained without the erased records would keep Ines. The retain term protects such records
first: each retain batch draws a share of its rows from the nearest neighbours.

Similarity is token overlap weighted by rarity (IDF over forget and retain records), so that the template
all records share counts for little and a shared name for much:
    s_j = max_i  sum_{t in R_j & F_i} idf(t) / sum_{t in R_j} idf(t)
for retain record j and forget record i, over their sets of token ids.
"""
from __future__ import annotations

import math
import random
from collections import Counter

from lethe.engine.data.records import EncodedRecord


def neighbour_scores(forget: list[EncodedRecord], retain: list[EncodedRecord]) -> list[float]:
    """s_j in [0, 1] for every retain record, in order."""
    forget_sets = [set(r.input_ids) for r in forget]
    retain_sets = [set(r.input_ids) for r in retain]
    documents = forget_sets + retain_sets
    frequency = Counter(t for d in documents for t in d)
    idf = {t: math.log((len(documents) + 1) / (n + 1)) for t, n in frequency.items()}
    scores = []
    for tokens in retain_sets:
        weight = sum(idf[t] for t in tokens)
        if weight <= 0:
            scores.append(0.0)
            continue
        scores.append(max(sum(idf[t] for t in tokens & f) for f in forget_sets) / weight)
    return scores


def nearest(scores: list[float], fraction: float = 0.25, minimum: int = 8) -> list[int]:
    """Indices of the nearest neighbours: the top `fraction` of retain records by score (at least
    `minimum`), keeping only those that share anything rare with the forget set."""
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], j))
    count = min(len(scores), max(minimum, math.ceil(fraction * len(scores))))
    return sorted(j for j in order[:count] if scores[j] > 0)


class RetainSampler:
    """Retain batches: a share of rows from the nearest neighbours, the rest uniformly from all records."""

    def __init__(self, retain: list[EncodedRecord], neighbours: list[int], share: float, rng: random.Random):
        self.retain, self.neighbours, self.share, self.rng = retain, neighbours, share, rng

    def sample(self, k: int) -> list[EncodedRecord]:
        from_neighbours = sum(self.rng.random() < self.share for _ in range(k)) if self.neighbours else 0
        picks = [self.retain[self.rng.choice(self.neighbours)] for _ in range(from_neighbours)]
        return picks + self.rng.choices(self.retain, k=k - from_neighbours)
