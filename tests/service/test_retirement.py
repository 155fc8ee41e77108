"""Issue 26, item 5: versions that predate an erasure can be retired (downloads 410 Gone, lineage and audit stay) and
purged (files deleted, manifest kept), by hand or automatically once an erasure succeeds; both are audited and
announced; the data-subject answer says which predating versions are still served."""
import uuid
from pathlib import Path

import pytest  # noqa: I001
from sqlalchemy import select

from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import AuditEntry, WebhookDelivery
from tests.live_service import auth, wait_for

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

FAST = {"lr": 1e-3, "max_steps": 1000}
QUICK_AUDIT = {"quantization": False, "relearn": False}
PROBLEM = "application/problem+json"


def erase(client, model_id, records, request_id, subjects=()):
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model_id, "request_id": request_id, "forget": records, "params": FAST, "audit": QUICK_AUDIT,
        "subjects": list(subjects)})
    assert answer.status_code == 202, answer.text
    job = wait_for(client, answer.json()["id"], timeout=400)
    assert job["state"] == "SUCCEEDED", job
    return job


def version(client, mid, n):
    return client.get(f"/v1/models/{mid}/versions/{n}", headers=auth()).json()


def test_retire_purge_and_retiring_predecessors_automatically(client, worker, fixture_model, retain_records,
                                                              forget_records, service_env):
    model = client.post("/v1/models", headers=auth(), json={
        "name": "retire-" + uuid.uuid4().hex[:6], "source": str(fixture_model), "retain": retain_records}).json()
    mid = model["id"]
    assert model["retire_predecessors"] is False
    hook = client.post("/v1/webhooks", headers=auth(), json={"url": "http://127.0.0.1:9/hook",
                                                             "events": ["version.*"]})
    assert hook.status_code == 201, hook.text
    # The only version is the head: neither retired nor purged.
    for action in ("retire", "purge"):
        answer = client.post(f"/v1/models/{mid}/versions/1:{action}", headers=auth())
        assert answer.status_code == 409 and answer.headers["content-type"] == PROBLEM, answer.text
        assert "is the head" in answer.json()["detail"]

    # The erasure names one of the model's retain records too: once it succeeds, the retain set no longer holds it.
    erased = erase(client, mid, forget_records[:4] + [{**retain_records[3], "id": "also-retained"}], "retire-r1",
                   ["subject-r"])
    first = erased["result"]["model_version"]
    assert erased["result"]["retain_records_pruned"] == 1
    assert client.get(f"/v1/models/{mid}", headers=auth()).json()["retain_count"] == len(retain_records) - 1
    assert version(client, mid, 1)["state"] == "READY"  # the setting is off: nothing retired by itself
    seen = client.get("/v1/subjects/subject-r", headers=auth()).json()["models"][0]
    assert seen["versions_predating_erasure"] == [1] and seen["versions_predating_retired"] == []

    # Retire v1: downloads answer 410, metadata and manifest stay; a second retire changes nothing.
    config = client.get(f"/v1/models/{mid}/versions/1/files/config.json", headers=auth())
    assert config.status_code == 200
    retired = client.post(f"/v1/models/{mid}/versions/1:retire", headers=auth())
    assert retired.status_code == 200 and retired.json()["state"] == "RETIRED" and retired.json()["retired_at"]
    for path in ("files/config.json", "archive"):
        gone = client.get(f"/v1/models/{mid}/versions/1/{path}", headers=auth())
        assert gone.status_code == 410 and gone.headers["content-type"] == PROBLEM, gone.text
    assert client.get(f"/v1/models/{mid}/versions/1/files", headers=auth()).json()["state"] == "RETIRED"
    again = client.post(f"/v1/models/{mid}/versions/1:retire", headers=auth())
    assert again.status_code == 200 and again.json()["retired_at"] == retired.json()["retired_at"]
    # A retired version is no job's base.
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": mid, "request_id": "from-retired", "forget": forget_records[4:6], "version": 1})
    assert answer.status_code == 410, answer.text
    seen = client.get("/v1/subjects/subject-r", headers=auth()).json()["models"][0]
    assert seen["versions_predating_erasure"] == [] and seen["versions_predating_retired"] == [1]

    # Purge v1: its files leave the store, its manifest stays.
    folder = Path(service_env["LETHE_ARTIFACT_ROOT"]) / "models" / mid / "v1"
    assert (folder / "config.json").exists()
    manifest = client.get(f"/v1/models/{mid}/versions/1/files", headers=auth()).json()
    purged = client.post(f"/v1/models/{mid}/versions/1:purge", headers=auth())
    assert purged.status_code == 200 and purged.json()["state"] == "PURGED" and purged.json()["purged_at"]
    assert not folder.exists() or not any(folder.iterdir())
    kept = client.get(f"/v1/models/{mid}/versions/1/files", headers=auth()).json()
    assert kept["manifest_sha256"] == manifest["manifest_sha256"] and kept["files"] == manifest["files"]
    assert client.get(f"/v1/models/{mid}/versions/1/files/config.json", headers=auth()).status_code == 410
    assert client.get("/v1/subjects/subject-r", headers=auth()).json()["models"][0]["versions_predating_purged"] == [1]

    # The setting on: the next erasure retires the version it supersedes (the one before it).
    updated = client.patch(f"/v1/models/{mid}", headers=auth(), json={"retire_predecessors": True})
    assert updated.status_code == 200 and updated.json()["retire_predecessors"] is True
    second = erase(client, mid, forget_records[4:8], "retire-r2")
    assert second["result"]["retired_versions"] == [first]
    assert version(client, mid, first)["state"] == "RETIRED"
    assert version(client, mid, second["result"]["model_version"])["state"] == "READY"
    assert client.get(f"/v1/models/{mid}/versions/latest", headers=auth()).json()["number"] == \
        second["result"]["model_version"]

    with session_scope() as session:
        kinds = [(e.kind, e.subject) for e in session.scalars(select(AuditEntry).where(
            AuditEntry.subject.like(f"{mid}/%"), AuditEntry.kind.like("version.%")).order_by(AuditEntry.seq))]
        events = sorted(d.event for d in session.scalars(select(WebhookDelivery).where(
            WebhookDelivery.endpoint_id == hook.json()["id"])))
    assert [k for k in kinds if k[0] != "version.created"] == [  # (model.retain_pruned names the model, not a version)
        ("version.retired", f"{mid}/v1"), ("version.purged", f"{mid}/v1"), ("version.retired", f"{mid}/v{first}")]
    assert events.count("version.retired") == 2 and events.count("version.purged") == 1
    client.delete(f"/v1/webhooks/{hook.json()['id']}", headers=auth())


def test_retire_and_purge_refuse_other_tenants_and_bad_numbers(client, registered_model):
    mid = registered_model["id"]
    other = client.post("/v1/api-keys", headers=auth(), json={"tenant": "elsewhere",
                                                               "scopes": ["models:write", "jobs:read"]}).json()
    assert client.post(f"/v1/models/{mid}/versions/1:retire", headers=auth(other["key"])).status_code == 404
    reader = client.post("/v1/api-keys", headers=auth(), json={"tenant": "default", "scopes": ["jobs:read"]}).json()
    assert client.post(f"/v1/models/{mid}/versions/1:purge", headers=auth(reader["key"])).status_code == 403
    for bad in ("0", "x", "99999"):
        answer = client.post(f"/v1/models/{mid}/versions/{bad}:retire", headers=auth())
        assert answer.status_code in (404, 422) and answer.headers["content-type"] == PROBLEM, (bad, answer.text)
