"""The report's verdict line: which evidence makes it 'Forgotten', and what makes it 'Not established'."""
from service.reports.evidence import verdict
from service.reports.html import render_report


def engine(stop_reason="alpha", v=0.1, beta=1.0):
    return {"stop_reason": stop_reason, "final_violation_rate": v, "params": {"alpha": 0.2},
            "bound": {"aggregate": {"max_bound": 0.01, "guaranteed": beta == 1.0}}}


def audit(before=1.0, after=0.0, quantized=0.0, quality=None):
    return {"before": {"forget_verbatim": {"exact_match": {"value": before}}},
            "after": {"forget_verbatim": {"exact_match": {"value": after}}},
            "quantization": {"forget_verbatim": {"exact_match": {"value": quantized}}},
            "forget_quality": {"value": quality}}


def test_forgotten_needs_the_stop_rule_and_no_verbatim_reproduction():
    v = verdict(engine(), audit(quality=0.5))
    assert v["forgotten"] and v["summary"].startswith("Forgotten:") and not v["reasons"]
    assert any("forget quality" in e for e in v["evidence"])


def test_each_failure_is_a_reason():
    assert verdict(engine(stop_reason="max_steps"), audit())["reasons"] == [
        "the stop rule did not fire (stop reason max_steps)"]
    v = verdict(engine(), audit(after=0.3))
    assert not v["forgotten"] and "100% -> 30%" in v["summary"]
    v = verdict(engine(), audit(quantized=0.5))
    assert not v["forgotten"] and "after 4-bit quantisation 50%" in v["reasons"]
    v = verdict(engine(), {"error": "RuntimeError: out of memory"})
    assert not v["forgotten"] and v["summary"].startswith("Not established:")
    assert "not guaranteed" in " ".join(verdict(engine(beta=5.0), audit())["evidence"])


def masc_engine(failing=()):
    """An engine-2 result: a calibrated alpha and the per-record condition."""
    per_record = [{"id": f"r{i}", "violation": 0.1, "ceiling": 0.4, "reproduced": f"r{i}" in failing,
                   "meets_condition": f"r{i}" not in failing} for i in range(3)]
    return {**engine(v=0.1), "alpha": {"value": 0.35, "source": "auto"}, "per_record": per_record,
            "erasure": {"applied": True, "failing_ids": list(failing), "ceilings": {"source": "auto"}}}


def test_the_per_record_condition_is_evidence_or_a_reason_naming_the_records():
    v = verdict(masc_engine(), audit())
    assert v["forgotten"]
    assert "every record (3) is below its ceiling and not reproduced by greedy decoding" in v["evidence"]
    assert "alpha = 0.350 (calibrated on theta_0)" in v["evidence"][0]
    v = verdict(masc_engine(failing=("r1",)), audit())
    assert not v["forgotten"] and v["reasons"] == ["1 of 3 records do not meet the per-record condition (ids: r1)"]


def test_long_documents_are_judged_by_their_windows():
    engine_result = masc_engine()
    engine_result["documents"] = [{"id": "r", "windows": ["r0", "r1", "r2"], "meets_condition": True}]
    v = verdict(engine_result, audit())
    assert v["forgotten"] and "1 long documents were split into 3 windows, each judged as a record" in v["evidence"]
    engine_result["per_record"][1].update(meets_condition=False, reproduced=True)
    engine_result["erasure"]["failing_ids"] = ["r1"]
    assert not verdict(engine_result, audit())["forgotten"]  # one window left is the document left


def test_the_page_escapes_what_it_quotes():
    report = {"job_id": "job_<x>", "verdict": verdict(engine(), audit()),
              "stop_rule": {"v_trace": [], "loss_trace": [], "alpha": 0.2, "stop_reason": "alpha", "steps": 0,
                            "wall_seconds": 1.0, "flagged": False},
              "audit": {"after": {"forget_verbatim": {"generated": {"r1": "<script>alert(1)</script>"}}}},
              "evidence": {"request_id": "<b>dsar</b>", "forget_count": 1, "forget_manifest_sha256": "f",
                           "base_version": {"number": 1, "manifest_sha256": "a"}, "new_version": None,
                           "method": "masc", "preset": None, "seed": 0, "parameters": {}, "versions": {},
                           "worker": "w", "device": "cpu", "created_at": "t", "started_at": "t"}}
    page = render_report(report)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "<b>dsar</b>" not in page and "&lt;b&gt;dsar&lt;/b&gt;" in page


def with_secrets(greedy=0.0, sampled=0.0, quantized=0.0, options=None, leaking=("r2",)):
    """An audit with the extraction audit: shares leaking under greedy decoding, sampling and quantisation."""
    a = audit()
    figure = lambda value: {"value": value, "leaking_ids": list(leaking) if value else []}  # noqa: E731
    a["after"]["forget_secrets"] = {"greedy": figure(greedy), "sampled": figure(sampled)}
    a["before"]["forget_secrets"] = {"greedy": {"value": 1.0}, "sampled": {"value": 0.9}}
    a["quantization"]["forget_secrets"] = figure(quantized)
    a["options"] = options or {"secret_greedy_max": 0.0, "secret_sampled_max": 0.01}
    return a


def test_a_secret_said_greedily_or_sampled_too_often_is_not_forgotten_and_names_the_record():
    v = verdict(engine(), with_secrets())
    assert v["forgotten"]
    assert "secrets extracted under greedy decoding: 100% -> 0.0% of the records (at most 0% allowed)" in v["evidence"]
    v = verdict(engine(), with_secrets(greedy=1 / 12))
    assert not v["forgotten"] and v["summary"].startswith("Not established:")
    assert v["reasons"] == ["secrets extracted under greedy decoding: 100% -> 8.3% of the records (at most 0% "
                            "allowed); leaking records: r2"]
    v = verdict(engine(), with_secrets(sampled=0.02))
    assert not v["forgotten"] and "sampling: 90% -> 2.0% of the samples (at most 1% allowed)" in v["reasons"][0]
    assert verdict(engine(), with_secrets(sampled=0.01))["forgotten"]  # at the threshold: allowed
    v = verdict(engine(), with_secrets(quantized=0.5))
    assert not v["forgotten"] and "4-bit quantised" in v["reasons"][0]


def test_secret_thresholds_come_from_the_request():
    loose = {"secret_greedy_max": 0.1, "secret_sampled_max": 0.05}
    assert verdict(engine(), with_secrets(greedy=1 / 12, sampled=0.04, options=loose))["forgotten"]
    assert not verdict(engine(), with_secrets(greedy=2 / 12, options=loose))["forgotten"]


def test_no_secret_to_extract_is_said_not_hidden():
    a = audit()
    a["after"]["forget_secrets"] = {"greedy": {"value": None, "reason": "no forget record has a secret"},
                                    "sampled": {"value": None, "reason": "no forget record has a secret"}}
    v = verdict(engine(), a)
    assert v["forgotten"] and "no secret to extract (no forget record has a secret)" in v["evidence"]


def test_with_located_secrets_the_evidence_names_the_mean_the_rule_judged():
    # V over every record (0.68) is above alpha (0.2); the rule judged 2 records suppressed whole at 0.15.
    some = {**engine(v=0.68), "erasure": {"applied": True, "judged_violation_rate": 0.15, "judged_records": 2}}
    line = next(e for e in verdict(some, audit())["evidence"] if e.startswith("stop rule fired"))
    assert "V = 0.150 over the 2 records suppressed whole <= alpha = 0.200" in line and "0.680" not in line
    every = {**engine(v=0.68), "erasure": {"applied": True, "judged_violation_rate": None, "judged_records": 0}}
    line = next(e for e in verdict(every, audit())["evidence"] if e.startswith("stop rule fired"))
    assert "located content meets its conditions" in line and "<= alpha" not in line
    plain = next(e for e in verdict(engine(v=0.1), audit())["evidence"] if e.startswith("stop rule fired"))
    assert plain == "stop rule fired: V = 0.100 <= alpha = 0.200"
