"""The report's verdict line: which evidence makes it 'Forgotten', and what makes it 'Not established'."""
from lethe.service.reports.evidence import verdict
from lethe.service.reports.html import render_report


def engine(stop_reason="alpha", v=0.1, beta=1.0):
    return {"stop_reason": stop_reason, "final_violation_rate": v, "params": {"alpha": 0.2},
            "bound": {"aggregate": {"max_bound": 0.01, "guaranteed": beta == 1.0}}}


IDS = ("r0", "r1", "r2")


def audit(before=1.0, after=0.0, quantized=0.0, quality=None, ids=IDS):
    """An audit whose per-record figures are all clean but for `after` / `quantized` records reproduced verbatim
    (the first ones, as a share of the records)."""
    def em(share):
        bad = round(share * len(ids))
        return {"value": share, "per_record": {rid: float(i < bad) for i, rid in enumerate(ids)}}
    loops = {"loop_share": {"value": 0.0, "per_record": {rid: 0.0 for rid in ids}}}
    return {"before": {"forget_verbatim": {"exact_match": em(before)}, "degeneration": {"forget": loops}},
            "after": {"forget_verbatim": {"exact_match": em(after)}, "degeneration": {"forget": loops}},
            "quantization": {"forget_verbatim": {"exact_match": em(quantized)}},
            "relearning": {"value": 0.0, "per_record": {rid: 0.0 for rid in ids}, "points": []},
            "forget_quality": {"value": quality}}


def test_forgotten_needs_the_stop_rule_and_no_verbatim_reproduction():
    v = verdict(engine(), audit(quality=0.5))
    assert v["forgotten"] and v["summary"].startswith("Forgotten:") and not v["reasons"]
    assert any("forget quality" in e for e in v["evidence"])


def test_each_failure_is_a_reason():
    assert verdict(engine(stop_reason="max_steps"), audit())["reasons"] == [
        "the stop rule did not fire (stop reason max_steps)"]
    v = verdict(engine(), audit(after=1 / 3))
    assert not v["forgotten"] and v["reasons"] == ["greedy answer to the prompt: 1 of 3 records leak (ids: r0)"]
    v = verdict(engine(), audit(quantized=2 / 3))
    assert not v["forgotten"] and v["reasons"] == ["greedy answer of the 4-bit copy: 2 of 3 records leak (ids: r0, r1)"]
    v = verdict(engine(), {"error": "RuntimeError: out of memory"})
    assert not v["forgotten"] and v["summary"].startswith("Not established:")
    assert "not guaranteed" in " ".join(verdict(engine(beta=5.0), audit())["evidence"])


def masc_engine(failing=()):
    """An engine-2 result: a calibrated alpha and the per-record condition."""
    per_record = [{"id": f"r{i}", "violation": 0.1, "ceiling": 0.4, "reproduced": f"r{i}" in failing,
                   "meets_condition": f"r{i}" not in failing} for i in range(3)]
    return {**engine(v=0.1), "alpha": {"value": 0.35, "source": "auto"}, "per_record": per_record,
            "erasure": {"applied": True, "failing_ids": list(failing), "ceilings": {"source": "auto"},
                        "served_checks": [{"dtype": "float32", "passed": not failing}]}}


def test_the_per_record_condition_is_evidence_or_a_reason_naming_the_records():
    v = verdict(masc_engine(), audit())
    assert v["forgotten"]
    assert "3 of 3 records meet the per-record condition, none reproduced by greedy decoding: 3 below their " \
        "ceiling; checked again on the saved checkpoint (float32)" in v["evidence"]
    assert "alpha = 0.350 (calibrated on theta_0)" in v["evidence"][0]
    v = verdict(masc_engine(failing=("r1",)), audit())
    assert not v["forgotten"] and v["reasons"] == [
        "stop rule's per-record condition: 1 of 3 records fail (ids: r1)"]


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
