"""Data subjects (issue 14): a deletion request names the subjects it concerns; the service answers, per subject,
which requests erased it, on which models and versions, with which verdict, and which versions predate the
erasure. Subject ids are kept only as hashes."""
import json

import pytest  # noqa: I001
from sqlalchemy import select

from lethe.service.domain.subjects import subject_hmac, subject_sha256
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import AuditEntry, ErasureSubject, Job
from tests.live_service import auth, wait_for
from tests.service.helpers import count

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

FAST = {"lr": 1e-3, "max_steps": 1000}
QUICK_AUDIT = {"quantization": False, "relearn": False}


def submit(client, model, forget, request_id, subjects, **extra):
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model["id"], "request_id": request_id, "forget": forget, "params": FAST,
        "audit": QUICK_AUDIT, "subjects": subjects, **extra})
    assert answer.status_code == 202, answer.text
    return answer.json()


def test_a_subject_is_traced_to_its_erasures_and_the_versions_that_predate_them(client, worker, registered_model,
                                                                                forget_records):
    mid = registered_model["id"]
    erased = wait_for(client, submit(client, registered_model, forget_records[:5], "dsar-s1",
                                     ["subject-42", "subject-7", "subject-42"])["id"], timeout=400)
    assert erased["state"] == "SUCCEEDED", erased
    new = erased["result"]["model_version"]
    # A second request for the same subject that never runs: it is listed, and erases nothing.
    pending = submit(client, registered_model, forget_records[5:8], "dsar-s2", ["subject-42"])
    client.post(f"/v1/unlearning-jobs/{pending['id']}:cancel", headers=auth())
    assert wait_for(client, pending["id"])["state"] == "CANCELLED"

    seen = client.get("/v1/subjects/subject-42", headers=auth()).json()
    assert seen["subject"] == "subject-42"
    assert [(r["request_id"], r["state"], r["version"]) for r in seen["requests"]] == \
        [("dsar-s1", "SUCCEEDED", new), ("dsar-s2", "CANCELLED", None)]
    assert isinstance(seen["requests"][0]["verdict"]["forgotten"], bool) and seen["requests"][1]["verdict"] is None
    [model] = seen["models"]
    assert model["model_id"] == mid and model["erased"] is True
    assert model["erased_in"] == [{"request_id": "dsar-s1", "version": new}]
    versions = [v["number"] for v in client.get(f"/v1/models/{mid}/versions", headers=auth()).json()["items"]]
    assert model["versions_holding_erasure"] == [new]
    assert model["versions_predating_erasure"] == [v for v in versions if v != new]  # the source version among them
    assert 1 in model["versions_predating_erasure"] and model["pending_requests"] == []

    assert [r["request_id"] for r in client.get("/v1/subjects/subject-7", headers=auth()).json()["requests"]] == \
        ["dsar-s1"]
    assert client.get("/v1/subjects/nobody-here", headers=auth()).json() == \
        {"subject": "nobody-here", "requests": [], "models": []}
    # Another tenant's subjects are its own.
    other = client.post("/v1/api-keys", headers=auth(), json={"tenant": "other", "scopes": ["jobs:read"]}).json()
    assert client.get("/v1/subjects/subject-42", headers=auth(other["key"])).json()["requests"] == []

    # The database keeps keyed hashes of the ids, once per request, never the ids or their plain hashes.
    with session_scope() as session:
        rows = session.scalars(select(ErasureSubject).where(ErasureSubject.job_id == erased["id"])).all()
        assert sorted(r.subject_hmac for r in rows) == sorted(
            subject_hmac("default", s) for s in ("subject-42", "subject-7"))
        logged = [json.dumps(e.data) for e in session.scalars(select(AuditEntry).where(
            AuditEntry.subject.in_([erased["id"], pending["id"]])))]
    assert logged and not any("subject-42" in entry for entry in logged)
    # Issue 26: keyed hashes, and none in the audit log (which every jobs:read key reads): a count only.
    assert not any(subject_sha256("default", "subject-42") in entry or subject_hmac("default", "subject-42") in entry
                   for entry in logged)
    assert any(json.loads(entry).get("subjects") == 2 for entry in logged)


def test_bad_subjects_are_refused_and_create_nothing(client, registered_model, forget_records, cancel_leftovers):
    before = count(Job)
    for subjects in (["a\x00b"], [""], ["x" * 257], "not-a-list", [7]):
        answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
            "model_id": registered_model["id"], "request_id": "dsar-bad", "forget": forget_records[:2],
            "subjects": subjects})
        assert answer.status_code == 422, (subjects, answer.text)
        assert answer.json()["errors"][0]["field"].startswith("subjects"), answer.json()
    assert count(Job) == before
    assert client.get("/v1/subjects/" + "y" * 257, headers=auth()).status_code == 422
