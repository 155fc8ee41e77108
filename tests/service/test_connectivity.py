"""Mode connectivity through the running service (SPEC section 6): curves requested with an unlearning
job (with the MCU ensemble stored as a tagged version), a connectivity job on its own, the stored
curves through the API and the report, and bad requests that change nothing."""
import re

import pytest  # noqa: I001

from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Connectivity, Job
from tests.live_service import auth, wait_for
from tests.service.browser import layout

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

FAST = {"lr": 1e-3, "max_steps": 1000}


def count_rows():
    with session_scope() as session:
        return session.query(Job).count(), session.query(Connectivity).count()


def test_unlearning_job_with_mcu_against_its_parent_and_an_ensemble(client, worker, registered_model, forget_records):
    mid = registered_model["id"]
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": mid, "request_id": "dsar-mcu", "forget": forget_records, "params": FAST,
        "audit": {"quantization": False, "relearn": False},
        "mcu": {"against": ["parent"], "curve": "linear", "points": 5, "ensemble": True,
                "params": {"ensemble_points": 3}}})
    assert answer.status_code == 202, answer.text
    done = wait_for(client, answer.json()["id"], timeout=400)
    assert done["state"] == "SUCCEEDED", done
    new, ensemble_number = done["result"]["model_version"], done["result"]["ensemble_version"]
    assert len(done["result"]["connectivity"]) == 1 and ensemble_number == new + 1

    curve = client.get(f"/v1/models/{mid}/connectivity/{done['result']['connectivity'][0]}", headers=auth()).json()
    assert (curve["a"], curve["b"], curve["curve"]) == (new - 1, new, "linear")
    assert [p["t"] for p in curve["points"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    first, last = curve["points"][0], curve["points"][-1]
    assert first["rouge_l"] > last["rouge_l"] and first["forget_nll"] < last["forget_nll"]
    b = curve["barriers"]
    assert curve["mcu_holds"] == (b["retain"]["value"] <= 0.05 and b["forget"]["value"] <= 0.05)
    assert curve["suppress_first"]["verbatim"]["t"] is not None
    assert curve["ensemble"]["version"] == ensemble_number and "model_utility" in curve["ensemble"]["evaluation"]

    # The ensemble is a version like any other, tagged, whose parent is the new version, audited on the request's
    # records like any version (issue 25): half of its weights are the parent's, which reproduces every record.
    version = client.get(f"/v1/models/{mid}/versions/{ensemble_number}", headers=auth()).json()
    judged = curve["ensemble"]["verdict"]
    assert version["parent"] == new and version["job_id"] is None and judged["summary"]
    parent_erased = client.get(f"/v1/models/{mid}/versions/{new - 1}", headers=auth()).json()["erased_request_ids"]
    # Whichever its verdict, the version stored says the same (the rule: lethe.worker.connectivity.ensemble_erasures,
    # tested in tests/engine/audit/test_verdict.py), and a version that did not earn the request is never `latest`.
    if judged["forgotten"]:
        assert version["tags"] == ["mcu-ensemble"] and version["erased_request_ids"] == parent_erased + ["dsar-mcu"]
    else:
        assert version["tags"] == ["mcu-ensemble", "not-forgotten"] and judged["leaking"]
        assert version["erased_request_ids"] == parent_erased
        assert client.get(f"/v1/models/{mid}/versions/latest", headers=auth()).json()["number"] == new

    listed = client.get(f"/v1/models/{mid}/connectivity", headers=auth()).json()["items"]
    assert curve["id"] in [c["id"] for c in listed]
    report = client.get(f"/v1/unlearning-jobs/{done['id']}/report", headers=auth()).json()
    assert report["connectivity"]["curves"][0]["id"] == curve["id"]
    page = client.get(f"/v1/unlearning-jobs/{done['id']}/report.html", headers=auth()).text
    section = page[page.index('<section id="connectivity">'):]
    # Retain and forget loss along t, each with the endpoint line; and the memorisation chart.
    assert len(re.findall(r"<svg", section[:section.index("</section>")])) == 3
    assert "endpoint line" in section and "MCU " in section and "suppress-first" in section


def test_connectivity_job_on_its_own_with_a_bezier_curve(client, worker, registered_model, forget_records):
    mid = registered_model["id"]
    answer = client.post(f"/v1/models/{mid}/connectivity", headers=auth(), json={
        "a": 1, "b": 2, "curve": "bezier", "points": 3, "forget": forget_records,
        "params": {"fit_steps": 10, "space": "lora", "lora_r": 2}})
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert job["kind"] == "connectivity"
    done = wait_for(client, job["id"], timeout=300)
    assert done["state"] == "SUCCEEDED", done
    curve = client.get(f"/v1/models/{mid}/connectivity/{done['result']['connectivity'][0]}", headers=auth()).json()
    assert (curve["a"], curve["b"], curve["curve"]) == (1, 2, "bezier")
    assert curve["details"]["space"] == "lora" and len(curve["details"]["fit"]["loss_trace"]) == 10
    assert len(curve["details"]["suppress_points"]) == 3  # the suppress-first analysis runs on the line
    report = client.get(f"/v1/unlearning-jobs/{job['id']}/report", headers=auth()).json()
    assert report["kind"] == "connectivity" and report["verdict"]["summary"].startswith("v1 -> v2 (bezier)")
    page = client.get(f"/v1/unlearning-jobs/{job['id']}/report.html", headers=auth()).text
    assert 'id="connectivity"' in page and "forget NLL along t" in page
    # Drawn by a browser: the verdict on the first screen, the three charts of the curve laid out.
    seen = layout(page)
    [verdict] = seen["verdict"]
    assert verdict["visible"] and verdict["top"] < seen["viewport"] and verdict["text"].startswith("v1 -> v2")
    assert len(seen["charts"]) == 3 and all(c["visible"] for c in seen["charts"])
    # The forget records are gone once the job is over; their evidence stays.
    with session_scope() as session:
        stored = session.get(Job, job["id"])
        assert stored.forget_records is None and stored.forget_evidence["count"] == len(forget_records)


def test_bad_connectivity_requests_change_nothing(client, registered_model, cancel_leftovers, forget_records):
    mid = registered_model["id"]
    before = count_rows()
    cases = [
        (f"/v1/models/{mid}/connectivity", {"a": 1, "b": 1}, "b"),
        (f"/v1/models/{mid}/connectivity", {"a": 1, "b": 99}, "b"),
        (f"/v1/models/{mid}/connectivity", {"a": 1, "b": 2, "points": 2}, "points"),
        (f"/v1/models/{mid}/connectivity", {"a": 1, "b": 2, "curve": "cubic"}, "curve"),
        (f"/v1/models/{mid}/connectivity", {"a": 1, "b": 2, "params": {"fit_steps": -1}}, "params.fit_steps"),
        (f"/v1/models/{mid}/connectivity", {"a": 1, "b": 2, "params": {"nope": 1}}, "params.nope"),
        (f"/v1/models/{mid}/connectivity", {"a": 1, "b": 2, "forget": [{"prompt": "x"}]}, "forget"),
        ("/v1/unlearning-jobs", {"model_id": mid, "request_id": "r", "forget": forget_records,
                                 "mcu": {"against": [99]}}, "mcu.against"),
        ("/v1/unlearning-jobs", {"model_id": mid, "request_id": "r", "forget": forget_records,
                                 "mcu": {"against": []}}, "mcu.against"),
        ("/v1/unlearning-jobs", {"model_id": mid, "request_id": "r", "forget": forget_records,
                                 "mcu": {"params": {"space": "diag"}}}, "mcu.params.space"),
        ("/v1/unlearning-jobs", {"model_id": mid, "request_id": "r", "forget": forget_records,
                                 "mcu": {"points": 2}}, "mcu.points"),
        # The curves of an unlearning job measure V with the job's own margin: set it in the job's params.
        ("/v1/unlearning-jobs", {"model_id": mid, "request_id": "r", "forget": forget_records,
                                 "mcu": {"params": {"k": 3}}}, "mcu.params.k"),
    ]
    for path, body, field in cases:
        answer = client.post(path, headers=auth(), json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert field in [e["field"] for e in answer.json()["errors"]], (field, answer.json())
    assert client.post("/v1/models/mdl_nope/connectivity", headers=auth(), json={"a": 1, "b": 2}).status_code == 404
    assert count_rows() == before
