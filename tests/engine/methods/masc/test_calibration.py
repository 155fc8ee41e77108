"""The stop rule's calibrated targets: counterfactual text, per-record ceilings, alpha "auto"; and the
retain neighbours, each against a brute-force version on small inputs."""
import math
import random
import re

import pytest

from lethe.engine.data.counterfactual import (
    counterfactuals,
    distinctive_words,
    request_counterfactuals,
    shared_template,
)
from lethe.engine.data.records import EncodedRecord
from lethe.engine.methods.masc.calibration import DEFAULT_CEILING, calibrate, counterfactual_records
from lethe.engine.methods.masc.neighbours import RetainSampler, nearest, neighbour_scores

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

FORGET = [
    {"id": "a", "prompt": "Q: What is the account of Dario Haddad?\nA:",
     "completion": " The account of Dario Haddad is 73-708064."},
    {"id": "b", "prompt": "Q: What does Mona Keller do?\nA:",
     "completion": " Mona Keller works as a glassblower in Ghent."},
]
RETAIN = [{"id": f"r{i}", "prompt": f"Q: Who is person {i}?\nA:",
           "completion": f" The account of person {i} is in Leeds."} for i in range(6)]


def test_counterfactuals_redraw_every_digit_and_swap_the_distinctive_words_only():
    template = shared_template(FORGET, RETAIN)
    assert {"the", "account", "of", "is"} <= template and "glassblower" not in template
    # ("a" is known: the prompt ends in "A:"; "as" and "in" are function words, template however few say them)
    assert {"as", "in", "they", "her"} <= template and "works" not in template
    assert distinctive_words(FORGET[1], template) == ["works", "glassblower", "Ghent"]
    versions = counterfactuals(FORGET[0], ["Lyon", "tuner"], template, random.Random(0))
    assert len(versions) == 3 and len(set(versions)) == 3
    for version in versions:
        # Same shape: the words stay (all are in the prompt or the template), every digit changes.
        assert re.sub(r"\d", "#", version) == re.sub(r"\d", "#", FORGET[0]["completion"])
        old_digits, new_digits = re.findall(r"\d", FORGET[0]["completion"]), re.findall(r"\d", version)
        assert all(o != n for o, n in zip(old_digits, new_digits))
    swapped = counterfactuals(FORGET[1], ["Lyon", "tuner"], template, random.Random(1))
    for version in swapped:
        assert version.startswith(" Mona Keller ")  # the prompt's words stay
        assert not {"glassblower", "Ghent"} & set(version.replace(".", "").split())
    assert counterfactuals(FORGET[1], ["Lyon"], template, random.Random(1)) == \
        counterfactuals(FORGET[1], ["Lyon"], template, random.Random(1))  # seeded
    plain = {"id": "c", "prompt": "Q: the account of?\nA:", "completion": " the account of"}
    assert counterfactuals(plain, ["Lyon"], template, random.Random(0)) == []  # nothing distinctive


def test_given_perturbed_completions_are_used_as_they_are():
    given = {**FORGET[0], "perturbed_completions": [" The account of Dario Haddad is 11-111111."]}
    out = request_counterfactuals([given, FORGET[1]], RETAIN, seed=0)
    assert out["a"] == given["perturbed_completions"] and len(out["b"]) == 3
    records = counterfactual_records([given, FORGET[1]], RETAIN, seed=0)
    assert records["a"] == [{"id": "a#cf0", "prompt": given["prompt"], "completion": given["perturbed_completions"][0]}]


def scripted(values: dict[str, float]):
    """A stand-in for theta_0's v_i: looked up by completion (or text), so the arithmetic can be checked."""
    def violation_of(records):
        return [values[r.get("completion", r.get("text"))] for r in records]
    return violation_of


def test_ceilings_are_theta0_violation_on_each_records_counterfactuals_and_alpha_their_mean():
    cf = counterfactual_records(FORGET, RETAIN, seed=0)
    values = {}
    for rid, base in (("a", 0.2), ("b", 0.5)):
        for j, record in enumerate(cf[rid]):
            values[record["completion"]] = base + 0.1 * j
    calibration = calibrate("auto", "auto", FORGET, RETAIN, [], 0, scripted(values))
    expected = {rid: sum(values[r["completion"]] for r in cf[rid]) / len(cf[rid]) for rid in ("a", "b")}
    assert calibration.ceilings == pytest.approx(expected)
    assert calibration.alpha == pytest.approx((expected["a"] + expected["b"]) / 2)
    assert calibration.summary["alpha"]["source"] == "auto"
    assert calibration.summary["ceilings"]["by_source"] == {"generated_counterfactuals": 2}
    # With record a decided by its located secrets, alpha "auto" describes the records the mean counts: b.
    only_b = calibrate("auto", "auto", FORGET, RETAIN, [], 0, scripted(values), mean_over={"b"})
    assert only_b.alpha == pytest.approx(expected["b"]) and only_b.ceilings == pytest.approx(expected)
    assert "(1 of 2: those without a located secret)" in only_b.summary["alpha"]["basis"]
    none_left = calibrate("auto", "auto", FORGET, RETAIN, [], 0, scripted(values), mean_over=set())
    assert none_left.alpha == pytest.approx(calibration.alpha) and "decide" in none_left.summary["alpha"]["basis"]


def test_records_without_counterfactuals_fall_back_to_holdout_then_the_median_then_the_default():
    plain = {"id": "c", "prompt": "Q: the account of?\nA:", "completion": " the account of"}
    cf = counterfactual_records([FORGET[0], plain], RETAIN, seed=0)
    values = {r["completion"]: 0.3 for r in cf["a"]}
    holdout = [{"id": "h", "prompt": "Q: x\nA:", "completion": " unseen"}]
    with_holdout = calibrate("auto", "auto", [FORGET[0], plain], RETAIN, holdout, 0,
                             scripted({**values, " unseen": 0.6}))
    assert with_holdout.ceilings == pytest.approx({"a": 0.3, "c": 0.6})
    assert with_holdout.summary["holdout_v"] == pytest.approx(0.6)
    assert with_holdout.summary["ceilings"]["by_source"] == {"generated_counterfactuals": 1, "holdout": 1}
    median = calibrate("auto", "auto", [FORGET[0], plain], RETAIN, [], 0, scripted(values))
    assert median.ceilings == pytest.approx({"a": 0.3, "c": 0.3})
    alone = calibrate("auto", "auto", [plain], [], [], 0, scripted({}))
    assert alone.ceilings == {"c": DEFAULT_CEILING} and alone.summary["ceilings"]["by_source"] == {"default": 1}


def test_numbers_given_are_used_as_given():
    calibration = calibrate(0.3, 0.8, FORGET, RETAIN, [], 0, scripted({}))
    assert calibration.alpha == 0.3 and calibration.ceilings == {"a": 0.8, "b": 0.8}
    assert calibration.summary["alpha"] == {"value": 0.3, "source": "given"}


def encoded(rid, ids):
    return EncodedRecord(id=rid, input_ids=ids, labels=ids, prompt_len=0)


def test_neighbour_scores_against_brute_force():
    forget = [encoded("f0", [1, 2, 3, 50]), encoded("f1", [1, 2, 3, 60])]
    retain = [encoded("r0", [1, 2, 3, 50, 51]), encoded("r1", [1, 2, 3, 70]), encoded("r2", [1, 2, 60, 61, 62])]
    documents = [set(r.input_ids) for r in forget + retain]

    def idf(t):
        return math.log((len(documents) + 1) / (sum(t in d for d in documents) + 1))

    expected = []
    for r in retain:
        tokens = set(r.input_ids)
        shared = max(sum(idf(t) for t in tokens & set(f.input_ids)) for f in forget)
        expected.append(shared / sum(idf(t) for t in tokens))
    assert neighbour_scores(forget, retain) == pytest.approx(expected)
    # r0 shares the rare 50, r2 the rare 60; r1 shares only the common template.
    assert expected[1] < min(expected[0], expected[2])
    assert nearest(expected, fraction=0.5, minimum=1) == [0, 2]


def test_retain_sampler_draws_its_share_from_the_neighbours():
    retain = [encoded(f"r{i}", [i]) for i in range(100)]
    sampler = RetainSampler(retain, [3, 7], 0.5, random.Random(0))
    drawn = [r.id for _ in range(400) for r in sampler.sample(5)]
    share = sum(rid in ("r3", "r7") for rid in drawn) / len(drawn)
    assert 0.45 < share < 0.56  # half from the two neighbours, plus their 2 % of the uniform half
    assert RetainSampler(retain, [], 0.5, random.Random(0)).sample(4)  # no neighbours: uniform
