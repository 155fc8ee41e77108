"""Issue 26, item 5: what an erasure leaves behind. A record being erased is not also kept (taken out of the job's
retain and holdout records, and out of the model's registered retain set once the erasure succeeds); an ended job
keeps no records; the audit log and webhooks carry a failed job's error code, never its free text."""
import hashlib
import json
import time

import pytest  # noqa: I001
from sqlalchemy import select

from lethe.service.domain.report_examples import report_sha256
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import AuditEntry, Job
from tests.live_service import auth, wait_for

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


def test_forget_records_leave_the_jobs_retain_and_holdout_records(client, registered_model, forget_records,
                                                                   retain_records):
    kept = client.get(f"/v1/models/{registered_model['id']}", headers=auth()).json()["retain_count"]
    # Two of the model's retain records, under other ids and other spacing, are asked to be erased.
    doubled = [{**retain_records[0], "id": "erase-me-1"},
               {**retain_records[1], "id": "erase-me-2", "completion": "  " + retain_records[1]["completion"] + " "}]
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "dup-retain", "forget": forget_records[:2] + doubled,
        "holdout": [retain_records[0], retain_records[5]], "params": {"max_steps": 1}})
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    with session_scope() as session:
        job = session.get_one(Job, job_id)
        contents = {(r["prompt"], r["completion"].strip()) for r in job.retain_records}
        assert len(job.retain_records) == kept - 2
        assert all((r["prompt"], r["completion"].strip()) not in contents for r in retain_records[:2])
        assert [r["id"] for r in job.holdout_records] == [retain_records[5]["id"]]
        queued = session.scalars(select(AuditEntry).where(AuditEntry.subject == job_id,
                                                          AuditEntry.kind == "job.queued")).one()
        assert queued.data["retain_removed"] == 2 and queued.data["holdout_removed"] == 1
    client.post(f"/v1/unlearning-jobs/{job_id}:cancel", headers=auth())
    assert wait_for(client, job_id)["state"] == "CANCELLED"
    with session_scope() as session:
        job = session.get_one(Job, job_id)
        assert job.forget_records is None and job.retain_records is None and job.holdout_records is None
    # Nothing was erased: the model's own retain set is as it was.
    assert client.get(f"/v1/models/{registered_model['id']}", headers=auth()).json()["retain_count"] == kept


def test_a_failed_jobs_error_reaches_the_audit_log_as_a_code(client, worker, registered_model):
    record = {"id": "patient-7734", "prompt": "Q: ", "completion": "Zanzibar-4471 " * 40}
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "fails-with-text", "forget": [record],
        "params": {"max_length": 8}})
    assert answer.status_code == 202, answer.text
    done = wait_for(client, answer.json()["id"], timeout=240)
    assert done["state"] == "FAILED" and done["error"]["detail"]  # the tenant's own view keeps the detail
    with session_scope() as session:
        entries = session.scalars(select(AuditEntry).where(AuditEntry.subject == done["id"])).all()
    failed = next(e for e in entries if e.kind == "job.failed")
    assert failed.data["error"] == {"code": done["error"]["type"].rsplit("/", 1)[-1], "status": done["error"]["status"]}
    logged = json.dumps([e.data for e in entries])
    assert "Zanzibar" not in logged and "patient-7734" not in logged and done["error"]["detail"] not in logged


def test_quoted_examples_are_replaced_by_their_hashes_after_their_retention(client, worker, registered_model,
                                                                            forget_records):
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "with-examples", "forget": forget_records[:3],
        "params": {"lr": 1e-3, "max_steps": 1000},
        "audit": {"quantization": False, "relearn": False, "examples": True}})
    assert answer.status_code == 202, answer.text
    done = wait_for(client, answer.json()["id"], timeout=300)
    assert done["state"] == "SUCCEEDED", done
    report = client.get(f"/v1/unlearning-jobs/{done['id']}/report", headers=auth()).json()
    quoted = report["audit"]["before"]["forget_verbatim"]["generated"]
    assert set(quoted) == {r["id"] for r in forget_records[:3]} and all(isinstance(t, str) for t in quoted.values())
    with session_scope() as session:
        job = session.get_one(Job, done["id"])
        assert job.examples_until is not None and (job.examples_until - job.ended_at).total_seconds() > 86400
        job.examples_until = job.ended_at  # the retention has passed: the sweeper (every second here) scrubs it
        logged = session.scalars(select(AuditEntry).where(AuditEntry.subject == done["id"],
                                                          AuditEntry.kind == "report.created")).one()
    deadline = time.time() + 30
    while time.time() < deadline:
        scrubbed = client.get(f"/v1/unlearning-jobs/{done['id']}/report", headers=auth()).json()
        if "examples_scrubbed_at" in scrubbed:
            break
        time.sleep(0.5)
    after = scrubbed["audit"]["before"]["forget_verbatim"]["generated"]
    assert after == {k: {"sha256": hashlib.sha256(t.encode()).hexdigest()} for k, t in quoted.items()}
    assert not any(t in json.dumps(scrubbed) for t in quoted.values() if len(t) > 8)
    # The report still checks against the hash the audit log recorded when it was written.
    assert report_sha256(scrubbed) == scrubbed["sha256"] == report["sha256"] == logged.data["report_sha256"]
    with session_scope() as session:
        assert session.get_one(Job, done["id"]).examples_until is None


def test_given_secrets_and_records_stay_as_evidence_only_as_keyed_hashes(service_env):
    from lethe.service.domain.digests import canonical_sha256, current_key, rekey
    from lethe.service.domain.jobs import forget_evidence

    secret = "73-708064"
    record = {"id": "a", "prompt": "Q?", "completion": " A is 73-708064.", "secrets": [secret]}
    evidence = forget_evidence([record, {"id": "b", "prompt": "Q?", "completion": " B."}])
    key = current_key()
    assert evidence["records"][0] == {"id": "a", "hmac": rekey(canonical_sha256(record), key),
                                      "secrets_hmac": [rekey(canonical_sha256(secret), key)]}
    assert "secrets_hmac" not in evidence["records"][1]
    dumped = json.dumps(evidence)
    # Neither the secret nor its plain hash (10^10 guesses for a phone number) is kept.
    assert "708064" not in dumped and canonical_sha256(secret) not in dumped
    # The key is not the database's: another audit key gives other hashes.
    assert rekey(canonical_sha256(secret), key) != rekey(canonical_sha256(secret), b"another key")
