"""Issue 28: a model's utility set, records no run trains on, measured before and after every erasure: registered,
replaced and checked through the API, read by the audit of a real worker's run, pruned of what an erasure erased."""
import uuid

import pytest
from sqlalchemy import select

from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import AuditEntry
from tests.live_service import auth, wait_for

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


def test_a_bad_utility_record_is_refused_and_changes_nothing(client, fixture_model, registered_model):
    name = "utility-bad-" + uuid.uuid4().hex[:6]
    answer = client.post("/v1/models", headers=auth(), json={"name": name, "source": str(fixture_model),
                                                             "utility": [{"id": "u1", "prompt": "Q: "}]})
    assert answer.status_code == 422 and answer.headers["content-type"].startswith("application/problem+json")
    assert "utility record 0" in answer.json()["detail"]
    listed = client.get("/v1/models", headers=auth(), params={"page_size": 500}).json()["items"]
    assert name not in {m["name"] for m in listed}
    patched = client.patch(f"/v1/models/{registered_model['id']}", headers=auth(), json={"utility": [{"id": 3}]})
    assert patched.status_code == 422
    assert client.get(f"/v1/models/{registered_model['id']}", headers=auth()).json()["utility_count"] == 0


def test_the_audit_measures_the_utility_set_and_an_erasure_prunes_it(client, worker, fixture_model, forget_records,
                                                                      retain_records):
    utility = [{**r, "id": f"u-{r['id']}"} for r in retain_records[:4]] + [{**forget_records[0], "id": "u-erased"}]
    answer = client.post("/v1/models", headers=auth(), json={
        "name": "utility-" + uuid.uuid4().hex[:6], "source": str(fixture_model), "retain": retain_records[4:],
        "utility": utility})
    assert answer.status_code == 201, answer.text
    model = answer.json()
    assert model["utility_count"] == 5
    job = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model["id"], "request_id": "with-utility", "forget": forget_records[:2],
        "params": {"max_steps": 20, "lr": 1e-3}, "audit": {"quantization": False, "relearn": False}}).json()
    done = wait_for(client, job["id"], timeout=300)
    assert done["state"] == "SUCCEEDED", done
    section = client.get(f"/v1/unlearning-jobs/{job['id']}/report", headers=auth()).json()["audit"]["utility_set"]
    # Measured on the four records it kept: the one being erased is no utility.
    assert section["records"] == 4
    assert 0 < section["value"] <= 1 and 0 < section["base_value"] <= 1
    assert section["change"] == pytest.approx(section["value"] - section["base_value"])
    # The erasure took its record out of the stored set, audited by count.
    assert client.get(f"/v1/models/{model['id']}", headers=auth()).json()["utility_count"] == 4
    with session_scope() as session:
        pruned = session.scalars(select(AuditEntry).where(AuditEntry.subject == model["id"],
                                                          AuditEntry.kind == "model.utility_pruned")).one()
    assert pruned.data == {"request_id": "with-utility", "removed": 1}
    # Replaced, then removed.
    replaced = client.patch(f"/v1/models/{model['id']}", headers=auth(), json={"utility": utility[:2]})
    assert replaced.status_code == 200 and replaced.json()["utility_count"] == 2
    assert client.patch(f"/v1/models/{model['id']}", headers=auth(), json={"utility": []}).json()[
        "utility_count"] == 0
