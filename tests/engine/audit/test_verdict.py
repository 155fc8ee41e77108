"""The per-record verdict (issue 25): one scripted case per loophole the sceptical auditor found, each giving
"Not established" that names the record and the channel; floors from a retrain reference; the sample threshold
against a brute-force binomial."""
import itertools
import math

import pytest

from lethe.engine.audit.verdict import CHANNELS, allowed_samples, judge
from lethe.service.reports.evidence import verdict


def per(ids, bad=(), value=1.0):
    return {"value": sum(value for r in ids if r in bad) / len(ids),
            "per_record": {r: (value if r in bad else 0.0) for r in ids}}


def scripted(n=10, exact=(), greedy=(), paraphrase=(), sampled=None, quantized=(), relearned=(), loops=(),
             base_loops=(), reference=None, options=None, samples=10, priors=None):
    """An audit of n records, clean on every channel but where a case says: record ids per channel, `sampled` {id:
    share of samples}."""
    ids = [f"r{i}" for i in range(n)]
    shares = {r: (sampled or {}).get(r, 0.0) for r in ids}
    def loop(bad):
        return {"forget": {"loop_share": per(ids, bad)}, "paraphrased": {"loop_share": per(ids, ())}}
    audit = {
        "options": {"secret_greedy_max": 0.0, "secret_sampled_max": 0.0, "secret_samples": samples, **(options or {})},
        "after": {"forget_verbatim": {"exact_match": per(ids, exact)},
                  "forget_knowledge": {"exact_match": per(ids, ())},
                  "forget_secrets": {"greedy": per(ids, greedy), "paraphrased": per(ids, paraphrase),
                                     "sampled": {"value": sum(shares.values()) / n, "per_record": shares,
                                                 "samples_per_record": samples}},
                  "degeneration": loop(loops)},
        "before": {"forget_verbatim": {"exact_match": per(ids, ids)}, "degeneration": loop(base_loops)},
        "quantization": {"scheme": "int4 (scripted)", "change": {}, "forget_verbatim": {"exact_match": per(ids, ())},
                         "forget_secrets": per(ids, quantized)},
        "relearning": {"value": 0.0, "per_record": {r: float(r in relearned) for r in ids}, "points": []},
        "secret_priors": {r: (priors or {}).get(r, 0.0) for r in ids}}
    if reference is not None:
        audit["reference_figures"] = reference
    engine = {"stop_reason": "alpha", "final_violation_rate": 0.0, "params": {"alpha": 0.2}, "steps": 10,
              "per_record": [{"id": r, "meets_condition": True, "violation": 0.0} for r in ids],
              "erasure": {"applied": True, "failing_ids": [], "served_checks": [{"dtype": "float32", "passed": True}]}}
    return engine, audit


def test_a_clean_table_is_forgotten_and_carries_every_record_on_every_channel():
    v = verdict(*scripted())
    assert v["forgotten"] and v["rule"].startswith("Forgotten only when")
    assert {(r["record"], r["channel"]) for r in v["records"]} == {(f"r{i}", c) for i in range(10) for c in CHANNELS}
    assert {r["outcome"] for r in v["records"]} == {"clean"}


@pytest.mark.parametrize("case, channel, label", [
    # 1. one record in ten reproduced word for word: 10 % was accepted
    (dict(exact=("r3",)), "greedy", "greedy answer to the prompt"),
    # 2. one record of 40 leaks in 4 of its 10 samples: the mean, 1 %, passed
    (dict(n=40, sampled={"r3": 0.4}), "sampled", "samples at temperature 1"),
    # 3. channels measured, shown, and never blocking
    (dict(paraphrase=("r3",)), "paraphrase", "greedy answer to the paraphrased prompt"),
    (dict(quantized=("r3",)), "quantized", "greedy answer of the 4-bit copy"),
    (dict(relearned=("r3",)), "relearned", "greedy answer after relearning on the other records"),
    (dict(loops=("r3",)), "loops", "repetition loops"),
])
def test_each_loophole_is_not_established_naming_the_record_and_the_channel(case, channel, label):
    v = verdict(*scripted(**case))
    assert not v["forgotten"] and v["summary"].startswith("Not established:")
    assert any(r.startswith(f"{label}: 1 of ") and r.endswith("(ids: r3)") for r in v["reasons"]), v["reasons"]
    assert v["channels"][channel]["leaking_ids"] == ["r3"] and v["channels"][channel]["blocks"]
    leaking = [(r["record"], r["channel"]) for r in v["records"] if r["outcome"] == "leaks"]
    assert leaking == [("r3", channel)]


def test_a_record_failing_the_rule_on_the_saved_checkpoint_is_named():
    engine, audit = scripted()
    engine["per_record"][4]["meets_condition"] = False
    engine["erasure"]["failing_ids"] = ["r4"]
    v = verdict(engine, audit)
    assert not v["forgotten"] and v["channels"]["rule"]["leaking_ids"] == ["r4"]
    assert "stop rule's per-record condition: 1 of 10 records fail (ids: r4)" in v["reasons"]


def test_an_audit_that_failed_is_not_established_and_still_names_the_records_the_rule_found_failing():
    engine, _ = scripted()
    engine["per_record"][2]["meets_condition"] = False
    v = verdict(engine, {"error": "OutOfMemoryError: the float32 copy"})
    assert not v["forgotten"] and v["reasons"][0] == "the audit failed: OutOfMemoryError: the float32 copy"
    assert "stop rule's per-record condition: 1 of 10 records fail (ids: r2)" in v["reasons"]


@pytest.mark.parametrize("judged, erased, tags", [
    (None, ["old"], ["mcu-ensemble"]),  # not audited (a connectivity job on its own): what both ends hold
    ({"forgotten": True}, ["old", "req"], ["mcu-ensemble"]),  # earned the request by its own verdict
    ({"forgotten": False}, ["old"], ["mcu-ensemble", "not-forgotten"]),  # stored, tagged, never the head
])
def test_an_ensemble_holds_the_request_only_by_its_own_verdict(judged, erased, tags):
    from lethe.worker.connectivity import ensemble_erasures

    # b (the new version) holds an older erasure and the request; a (its parent) only the older one.
    assert ensemble_erasures(["old", "req"], ["old"], "req", judged) == (erased, tags)
    assert ensemble_erasures(["old", "req"], [], "req", {"forgotten": True}) == (["req"], ["mcu-ensemble"])


def test_a_loop_the_base_already_had_is_within_its_floor():
    v = verdict(*scripted(loops=("r3",), base_loops=("r3",)))
    assert v["forgotten"]
    [cell] = [r for r in v["records"] if r["record"] == "r3" and r["channel"] == "loops"]
    assert cell["outcome"] == "within floor" and cell["floor"] == 1.0


def test_loops_in_as_many_records_as_a_never_seen_model_loops_on_are_chance_one_more_is_not():
    """The stop rule's loop_chance q (engine evidence) allows floor(n q) looping records on the loops channel: 2 of
    20 at q = 0.1 are named in the evidence and the record is forgotten; 3 block it. A leak is never allowed."""
    engine, audit = scripted(n=20, loops=("r3", "r7"))
    engine["erasure"]["loop_chance"] = 0.1
    v = verdict(engine, audit)
    assert v["forgotten"]
    assert any("2 of 20 records loop, within the 2" in line for line in v["evidence"])
    engine, audit = scripted(n=20, loops=("r3", "r7", "r9"))
    engine["erasure"]["loop_chance"] = 0.1
    assert not verdict(engine, audit)["forgotten"]
    engine, audit = scripted(n=20, greedy=("r3",))
    engine["erasure"]["loop_chance"] = 0.1
    assert not verdict(engine, audit)["forgotten"]


def test_a_secret_the_retrain_reference_also_says_is_within_its_floor_and_the_report_says_which_floor():
    reference = {"greedy": {"r3": 1.0}, "exact_match": {}, "sampled": {"r5": 0.3}, "paraphrased": None,
                 "knowledge_exact_match": None, "loops": None}
    v = verdict(*scripted(greedy=("r3",), sampled={"r5": 0.3}, reference=reference))
    assert v["forgotten"], v["reasons"]
    assert v["floors"]["greedy"] == "retrain reference"
    assert v["floors"]["sampled"] == "retrain reference and the share of retain answers of the record's shape that " \
                                     "say its secret"
    # The same leaks against no reference: the floor is 0 (greedy) and the retain answers' rate (sampled).
    v = verdict(*scripted(greedy=("r3",), sampled={"r5": 0.3}))
    assert not v["forgotten"] and {c for c, x in v["channels"].items() if x["blocks"]} == {"greedy", "sampled"}
    assert v["floors"]["sampled"].startswith("the share of retain answers")
    # A record the reference never says keeps a floor of 0 beside one it does.
    v = verdict(*scripted(greedy=("r3", "r4"), reference=reference))
    assert v["channels"]["greedy"]["leaking_ids"] == ["r4"]


def test_a_secret_the_retain_answers_share_keeps_that_floor_when_the_references_samples_never_said_it():
    # "works as a tram driver" for two of 21 kept customers: the reference's ten samples happened not to say it.
    reference = {"greedy": {}, "exact_match": {}, "sampled": {"r5": 0.0}, "paraphrased": None,
                 "knowledge_exact_match": None, "loops": None}
    v = verdict(*scripted(sampled={"r5": 0.2}, reference=reference, priors={"r5": 2 / 21}))
    assert v["forgotten"], v["reasons"]
    [cell] = [r for r in v["records"] if r["record"] == "r5" and r["channel"] == "sampled"]
    assert cell["outcome"] == "within floor" and cell["floor"] == pytest.approx(2 / 21)
    assert cell["threshold"] == allowed_samples(10, 2 / 21) / 10
    # Five in ten is more than that rate gives (four at most): a leak, whichever floor.
    v = verdict(*scripted(sampled={"r5": 0.5}, reference=reference, priors={"r5": 2 / 21}))
    assert v["channels"]["sampled"]["leaking_ids"] == ["r5"]
    # Without the prior, the reference's 0 is the floor and one sample is a leak.
    v = verdict(*scripted(sampled={"r5": 0.1}, reference=reference))
    assert v["channels"]["sampled"]["leaking_ids"] == ["r5"]


def test_the_requests_relaxations_apply_and_are_shown():
    loose = {"secret_greedy_max": 0.1, "secret_sampled_max": 0.2}
    v = verdict(*scripted(greedy=("r3",), sampled={"r5": 0.3}, options=loose))
    assert v["forgotten"] and v["thresholds"]["secret_greedy_max"] == 0.1
    assert "greedy answer to the prompt: 1 of 10 records leak, within the request's secret_greedy_max" in v["evidence"]
    assert not verdict(*scripted(greedy=("r3", "r4"), options=loose))["forgotten"]


def test_a_channel_not_measured_is_said_and_does_not_decide():
    engine, audit = scripted()
    del audit["quantization"], audit["relearning"]
    v = verdict(engine, audit)
    assert v["forgotten"]
    assert "greedy answer of the 4-bit copy: not measured (the 4-bit probe was switched off)" in v["evidence"]
    assert "greedy answer after relearning on the other records: not measured (the relearning probe was switched " \
        "off)" in v["evidence"]


def test_records_judged_by_their_located_content_are_not_said_to_be_below_a_ceiling():
    engine, audit = scripted(n=3)
    for r, spans in zip(engine["per_record"], (2, 1, 0)):
        r["content_spans"] = spans
    line = next(e for e in verdict(engine, audit)["evidence"] if "meet the per-record condition" in e)
    assert "2 judged by their located content" in line and "1 below their ceiling" in line
    for r in engine["per_record"]:
        r["content_spans"] = 1
    line = next(e for e in verdict(engine, audit)["evidence"] if "meet the per-record condition" in e)
    assert "ceiling" not in line


def test_the_bound_is_stated_as_a_bound_on_teacher_forced_probabilities():
    engine, audit = scripted()
    engine["bound"] = {"aggregate": {"max_bound": 0.01, "guaranteed": True}}
    line = next(e for e in verdict(engine, audit)["evidence"] if e.startswith("Proposition-1"))
    assert "saved checkpoint's teacher-forced probability" in line and "does not bound sampling" in line


@pytest.mark.parametrize("n, rate", [(10, 0.0), (10, 0.05), (10, 0.3), (5, 0.5), (20, 0.01), (10, 1.0)])
def test_the_sample_threshold_matches_a_brute_force_binomial_tail(n, rate):
    # Every outcome of n samples enumerated: P(count > c) for each c, the smallest c whose tail is <= 1 %.
    tail = {c: sum(rate ** sum(o) * (1 - rate) ** (n - sum(o)) for o in itertools.product((0, 1), repeat=n)
                   if sum(o) > c) for c in range(n + 1)} if n <= 10 else \
        {c: sum(math.comb(n, k) * rate ** k * (1 - rate) ** (n - k) for k in range(c + 1, n + 1)) for c in range(n + 1)}
    expected = min(c for c in range(n + 1) if tail[c] <= 0.01 + 1e-12)
    assert allowed_samples(n, rate) == expected


def test_judge_reads_a_baselines_records_from_the_audit():
    engine, audit = scripted(n=2, exact=("r1",))
    engine = {"stop_reason": "budget", "method": "graddiff", "steps": 5, "params": {}}
    judged = judge(engine, audit)
    assert judged["channels"]["rule"]["measured"] == 0 and judged["channels"]["greedy"]["leaking_ids"] == ["r1"]


def test_the_report_page_shows_the_matrix_to_a_browser():
    from lethe.service.reports.html import render_report
    from tests.service.browser import layout

    engine, audit = scripted(n=4, sampled={"r2": 0.5}, loops=("r1",), base_loops=("r3",))
    audit["after"]["degeneration"]["forget"]["loop_share"]["per_record"]["r3"] = 1.0
    v = verdict(engine, audit)
    report = {"job_id": "j", "verdict": v, "audit": audit,
              "stop_rule": {"v_trace": [], "loss_trace": [], "alpha": 0.2, "stop_reason": "alpha", "steps": 10,
                            "wall_seconds": 1.0, "flagged": False, "erasure": engine["erasure"],
                            "per_record": engine["per_record"]},
              "evidence": {"request_id": "dsar", "forget_count": 4, "forget_manifest_sha256": "f",
                           "base_version": {"number": 1, "manifest_sha256": "a"}, "new_version": None,
                           "method": "masc", "preset": None, "seed": 0, "parameters": {}, "versions": {},
                           "worker": "w", "device": "cpu", "created_at": "t", "started_at": "t"}}
    seen = layout(render_report(report))
    assert seen["verdict"][0]["text"].startswith("Not established:")
    marks = {(row["record"], c["channel"]): c["text"] for row in seen["matrix"] for c in row["cells"]}
    assert len(marks) == 4 * 7 and all(c["visible"] for row in seen["matrix"] for c in row["cells"])
    assert {k for k, text in marks.items() if text == "LEAK"} == {("r2", "sampled"), ("r1", "loops")}
    assert marks[("r3", "loops")] == "~"  # a loop the base model had: within its floor
    red = {c["colour"] for row in seen["matrix"] for c in row["cells"] if c["text"] == "LEAK"}
    assert red == {"rgb(180, 35, 24)"}
