"""Audit metrics against hand-computed values and brute force on tiny inputs."""
import itertools
import math
import random
import zlib

import pytest
import torch
import torch.nn.functional as F

from lethe.engine.audit.metrics import harmonic_mean
from lethe.engine.audit.metrics.forward import TokenStats, token_stats
from lethe.engine.audit.metrics.privacy import attack_scores, muse_auc, privleak, roc_auc
from lethe.engine.audit.metrics.stats import ks_p_value
from lethe.engine.audit.metrics.text import rouge_l_recall
from lethe.engine.audit.metrics.truth_ratio import forget_score, retain_score, truth_ratio
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import encode_records
from lethe.engine.model.loading import load_model


def lcs(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_rouge_l_recall_by_hand_and_against_a_brute_force_lcs():
    # LCS of "the cat sat on the mat" and "the cat on a mat" is "the cat on mat": 4 of 6 words.
    assert rouge_l_recall("the cat sat on the mat", "the cat on a mat") == pytest.approx(4 / 6)
    assert rouge_l_recall("Kalo plays the harp.", "kalo plays the harp") == 1.0  # case and punctuation
    rng = random.Random(0)
    words = ["red", "blue", "green", "tall", "small", "dog", "bird"]  # no stemming changes these
    for _ in range(50):
        ref = [rng.choice(words) for _ in range(rng.randint(1, 9))]
        gen = [rng.choice(words) for _ in range(rng.randint(0, 9))]
        assert rouge_l_recall(" ".join(ref), " ".join(gen)) == pytest.approx(lcs(ref, gen) / len(ref))


@pytest.mark.parametrize("correct,expected", [([1, 1, 1, 1], 1.0), ([0, 1, 1, 1], 0.75), ([1, 0, 1, 1], 0.5),
                                              ([1, 1, 1, 0], 0.0), ([0, 0, 0, 0], 0.0), ([1], 1.0)])
def test_extraction_strength(correct, expected):
    stats = TokenStats("r", [-1.0] * len(correct), [bool(c) for c in correct], [0.0] * len(correct))
    # brute force: the smallest k with every prediction from k on correct
    k_star = min(k for k in range(len(correct) + 1) if all(correct[k:]))
    assert stats.extraction_strength == expected == 1 - k_star / len(correct)
    assert stats.token_accuracy == sum(correct) / len(correct)


def test_token_stats_match_one_record_at_a_time(fixture_model, forget_records):
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    records = encode_records(normalise_records(forget_records[:5], "forget"), tokenizer, max_length=512, seed=0,
                             what="forget")
    batched = token_stats(model, records, tokenizer.pad_token_id, batch_size=5)
    for record, stats in zip(records, batched):
        ids = torch.tensor([record.input_ids])
        with torch.no_grad():
            log_p = F.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        positions = [t for t in range(len(record.input_ids) - 1) if record.labels[t + 1] >= 0]
        expected_lp = [log_p[t, record.labels[t + 1]].item() for t in positions]
        assert stats.logprobs == pytest.approx(expected_lp, abs=1e-4)
        assert stats.correct == [log_p[t].argmax().item() == record.labels[t + 1] for t in positions]
        for t, z in zip(positions, stats.zscores):
            p = log_p[t].exp()
            mu = (p * log_p[t]).sum()
            sigma = ((p * (log_p[t] - mu) ** 2).sum()).sqrt()
            assert z == pytest.approx(((log_p[t, record.labels[t + 1]] - mu) / sigma).item(), abs=1e-3)
        assert stats.probability == pytest.approx(math.exp(sum(expected_lp) / len(expected_lp)), rel=1e-4)


def test_truth_ratio_by_hand():
    # P(paraphrased) = 0.5, P(perturbed) = 0.25 and 0.0625: geomean 0.125, TR = 0.25.
    tr = truth_ratio(math.log(0.5), [math.log(0.25), math.log(0.0625)])
    assert tr == pytest.approx(0.25)
    assert forget_score({"a": tr, "b": 4.0})["value"] == pytest.approx(0.25)  # min(TR, 1/TR)
    assert retain_score({"a": tr, "b": 4.0})["per_record"] == {"a": pytest.approx(0.75), "b": 0.0}


def brute_ks_p(x, y):
    """Exact two-sided permutation p-value of the KS statistic (no ties)."""
    def statistic(a, b):
        return max(abs(sum(v <= t for v in a) / len(a) - sum(v <= t for v in b) / len(b)) for t in a + b)

    observed, pooled = statistic(x, y), x + y
    splits = list(itertools.combinations(range(len(pooled)), len(x)))
    extreme = sum(statistic([pooled[i] for i in idx], [pooled[i] for i in range(len(pooled)) if i not in idx])
                  >= observed - 1e-12 for idx in splits)
    return extreme / len(splits)


def test_ks_p_value_against_exact_enumeration():
    assert ks_p_value([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)  # 2 of C(6,3) = 20 splits
    rng = random.Random(1)
    for _ in range(5):
        x = [rng.random() for _ in range(rng.randint(3, 5))]
        y = [rng.random() for _ in range(rng.randint(3, 5))]
        assert ks_p_value(x, y) == pytest.approx(brute_ks_p(x, y), abs=1e-9)


def test_auc_on_constructed_scores_and_against_pairwise_counting():
    assert roc_auc([3, 2, 1], [0, 1]) == pytest.approx(5.5 / 6)  # one tie counts half
    assert roc_auc([5, 6], [1, 2]) == 1.0 and roc_auc([1, 2], [5, 6]) == 0.0
    rng = random.Random(2)
    for _ in range(30):
        a = [rng.randint(0, 5) for _ in range(rng.randint(1, 6))]
        b = [rng.randint(0, 5) for _ in range(rng.randint(1, 6))]
        pairs = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)
        assert roc_auc(a, b) == pytest.approx(pairs / (len(a) * len(b)))


def test_privleak_in_muse_sign():
    # An attack that tells every forget record from every holdout record (attack AUC 1): the model still
    # memorises, MUSE's AUC is 0 and PrivLeak -100 against a retrain at 0.5.
    assert muse_auc(1.0) == 0.0 and privleak(muse_auc(1.0), 0.5) == pytest.approx(-100.0)
    assert privleak(muse_auc(0.5), 0.5) == 0.0  # looks like the retrain
    # Unlearned past the retrain: forget records look less like members than holdout ones.
    assert privleak(muse_auc(0.2), 0.5) == pytest.approx(60.0)
    # Against a retrain reference whose own MUSE AUC is 0.4: (0.3 - 0.4) / 0.4.
    assert privleak(muse_auc(0.7), muse_auc(0.6)) == pytest.approx(-25.0)
    assert muse_auc(roc_auc([3, 2, 1], [0, 1])) == pytest.approx(0.5 / 6)


def test_attack_scores_by_hand():
    stats = TokenStats("r", [-1.0, -5.0, -2.0, -3.0, -0.5], [True] * 5, [0.5, -2.0, 1.0, -1.0, 0.0])
    scores = attack_scores(stats, "some text")
    assert scores["loss"] == pytest.approx(-11.5 / 5)
    assert scores["min_k"] == pytest.approx(-4.0)  # the lowest 40 %: -5 and -3
    assert scores["min_k_pp"] == pytest.approx(-1.5)  # -2 and -1
    assert scores["zlib"] == pytest.approx(-(11.5 / 5) / len(zlib.compress(b"some text")))  # mean loss / zlib
    assert harmonic_mean([0.5, 0.25]) == pytest.approx(1 / 3) and harmonic_mean([0.5, 0.0]) == 0.0


def test_privleak_is_null_with_a_reason_when_the_reference_memorised_the_forget_set():
    from lethe.engine.audit.run import _privleak

    def evaluation(attack_auc):
        return {"membership": {a: {"value": attack_auc} for a in ("loss", "zlib", "min_k", "min_k_pp")}}

    leak = _privleak(evaluation(1.0), evaluation(1.0), True)["loss"]  # MUSE's AUC of the reference: 0
    assert leak["value"] is None and "undefined" in leak["reason"]
    leak = _privleak(evaluation(1.0), None, True)["loss"]
    assert leak["value"] == pytest.approx(-100.0) and leak["reference_auc"] == 0.5
