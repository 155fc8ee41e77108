"""Authentication, tenants, idempotency, and bad input: a clear 4xx problem+json that changes nothing."""
import uuid

import pytest
from sqlalchemy import func, select

from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Job, Model
from tests.live_service import auth

PROBLEM = "application/problem+json"


def count(table) -> int:
    with session_scope() as session:
        return session.scalar(select(func.count()).select_from(table))


def new_key(client, tenant, scopes):
    answer = client.post("/v1/api-keys", headers=auth(), json={"tenant": tenant, "scopes": scopes})
    assert answer.status_code == 201, answer.text
    return answer.json()["key"]


def job_body(model, forget, **overrides):
    return {"model_id": model["id"], "request_id": "dsar-" + uuid.uuid4().hex[:6], "forget": forget,
            "params": {"max_steps": 1}, **overrides}


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cancel_leftovers")]


def test_health_needs_no_key_and_everything_else_does(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "broker": "ok"}
    for path in ("/v1/models", "/v1/unlearning-jobs", "/metrics"):
        answer = client.get(path)
        assert answer.status_code == 401 and answer.headers["content-type"] == PROBLEM
        assert answer.json()["type"].endswith("/unauthenticated")
    assert client.get("/v1/models", headers={"Authorization": "Bearer not-a-key"}).status_code == 401
    assert client.get("/openapi.json").json()["info"]["title"] == "Lethe"


def test_scopes_are_enforced(client, registered_model, forget_records):
    reader = new_key(client, "default", ["jobs:read"])
    jobs_before = count(Job)
    answer = client.post("/v1/unlearning-jobs", headers=auth(reader), json=job_body(registered_model, forget_records))
    assert answer.status_code == 403 and answer.json()["type"].endswith("/forbidden")
    assert client.get(f"/v1/models/{registered_model['id']}", headers=auth(reader)).status_code == 200
    assert client.get(f"/v1/models/{registered_model['id']}/versions/1/files", headers=auth(reader)).status_code == 403
    assert client.post("/v1/api-keys", headers=auth(reader),
                       json={"tenant": "x", "scopes": ["admin"]}).status_code == 403
    assert count(Job) == jobs_before
    # Every tenant's job counts are the operator's: a tenant's reader key is refused, a scraper key is not.
    assert client.get("/metrics", headers=auth(reader)).status_code == 403
    scraper = new_key(client, "default", ["metrics:read"])
    metrics = client.get("/metrics", headers=auth(scraper))
    assert metrics.status_code == 200 and 'lethe_jobs{state="QUEUED"}' in metrics.text


def test_another_tenants_ids_answer_404(client, registered_model, forget_records):
    other = new_key(client, "tenant-b", ["jobs:read", "jobs:write", "artifacts:read", "models:write"])
    for path in (f"/v1/models/{registered_model['id']}", f"/v1/models/{registered_model['id']}/versions",
                 f"/v1/models/{registered_model['id']}/versions/1/archive"):
        assert client.get(path, headers=auth(other)).status_code == 404
    assert client.get("/v1/models", headers=auth(other)).json()["items"] == []
    answer = client.post("/v1/unlearning-jobs", headers=auth(other), json=job_body(registered_model, forget_records))
    assert answer.status_code == 404
    mine = client.post("/v1/unlearning-jobs", headers=auth(), json=job_body(registered_model, forget_records[:3],
                                                                            params={"max_steps": 1}))
    assert mine.status_code == 202
    assert client.get(f"/v1/unlearning-jobs/{mine.json()['id']}", headers=auth(other)).status_code == 404
    assert client.post(f"/v1/unlearning-jobs/{mine.json()['id']}:cancel", headers=auth(other)).status_code == 404
    theirs = client.get("/v1/audit-log", headers=auth(other)).json()["items"]
    assert theirs and {e["kind"] for e in theirs} == {"key.created"}  # their own key, nothing of ours


def test_idempotency_replays_and_refuses_another_body(client, registered_model, forget_records):
    key = "idem-" + uuid.uuid4().hex
    body = job_body(registered_model, forget_records[:4])
    headers = {**auth(), "Idempotency-Key": key}
    first = client.post("/v1/unlearning-jobs", headers=headers, json=body)
    jobs_after_first = count(Job)
    again = client.post("/v1/unlearning-jobs", headers=headers, json=body)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again.headers["location"] == first.headers["location"]
    assert again.headers.get("idempotent-replayed") == "true"
    other = client.post("/v1/unlearning-jobs", headers=headers, json={**body, "request_id": "something-else"})
    assert other.status_code == 422 and other.json()["type"].endswith("/idempotency-key-reused")
    assert count(Job) == jobs_after_first


def test_pagination_walks_every_job_once(client, registered_model, forget_records):
    for _ in range(3):
        assert client.post("/v1/unlearning-jobs", headers=auth(),
                           json=job_body(registered_model, forget_records[:2])).status_code == 202
    seen, token = [], None
    while True:
        page = client.get("/v1/unlearning-jobs", headers=auth(),
                          params={"page_size": 2, **({"page_token": token} if token else {})}).json()
        seen += [j["id"] for j in page["items"]]
        token = page["next_page_token"]
        if not token:
            break
    with session_scope() as session:  # the admin key's tenant: other modules make jobs of other tenants
        mine = session.scalar(select(func.count()).select_from(Job).where(Job.tenant == "default"))
    assert len(seen) == len(set(seen)) == mine
    assert client.get("/v1/unlearning-jobs", headers=auth(), params={"page_token": "garbage"}).status_code == 422
    for token in ("9" * 40, "²", "-1"):  # the audit log's sequence tokens: too large (was a 500), not ASCII digits
        assert client.get("/v1/audit-log", headers=auth(), params={"page_token": token}).status_code == 422
    queued = client.get("/v1/unlearning-jobs", headers=auth(), params={"state": "SUCCEEDED"}).json()["items"]
    assert all(j["state"] == "SUCCEEDED" for j in queued)


BAD_JOBS = [
    ("malformed JSON", None, 400, "/malformed-json"),
    ("wrong type", {"forget": "not a list"}, 422, "/invalid-request"),
    ("unknown field", {"colour": "blue"}, 422, "/invalid-request"),
    ("empty forget", {"forget": []}, 422, "/invalid-request"),
    ("record without fields", {"forget": [{"id": "x"}]}, 422, "/invalid-request"),
    ("empty completion", {"forget": [{"prompt": "Q", "completion": ""}]}, 422, "/invalid-request"),
    ("unknown model", {"model_id": "mdl_nope"}, 404, "/not-found"),
    ("unknown version", {"version": 99}, 404, "/not-found"),
    ("alpha out of range", {"params": {"alpha": 2}}, 422, "/invalid-request"),
    ("unknown parameter", {"params": {"gamma": 1}}, 422, "/invalid-request"),
    ("unknown preset", {"preset": "llama-9000"}, 422, "/invalid-request"),
    ("unknown method", {"method": "sorcery"}, 422, "/invalid-request"),
    ("baseline given a MASC parameter", {"method": "npo", "params": {"alpha": 0.2}}, 422, "/invalid-request"),
    ("baseline given a preset", {"method": "graddiff", "params": {}, "preset": "tofu-llama2"}, 422, "/invalid-request"),
    ("alpha neither auto nor a number", {"params": {"alpha": "automatic"}}, 422, "/invalid-request"),
    ("LoRA target the model lacks", {"params": {"lora_targets": ["c_attn"]}}, 422, "/invalid-request"),
]


@pytest.mark.parametrize("name,change,status,kind", BAD_JOBS, ids=[b[0] for b in BAD_JOBS])
def test_bad_job_requests_are_refused_and_create_nothing(client, registered_model, forget_records, name, change,
                                                         status, kind):
    before = count(Job)
    headers = {**auth(), "Content-Type": "application/json"}
    if change is None:
        answer = client.post("/v1/unlearning-jobs", headers=headers, content=b'{"model_id": ')
    else:
        answer = client.post("/v1/unlearning-jobs", headers=headers,
                             json={**job_body(registered_model, forget_records), **change})
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    problem = answer.json()
    assert problem["type"].endswith(kind) and problem["status"] == status and problem["title"]
    assert count(Job) == before


def test_a_missing_lora_target_is_refused_with_the_modules_the_model_has(client, registered_model, forget_records):
    before = count(Job)
    body = job_body(registered_model, forget_records, params={"lora_targets": ["q_proj", "c_attn"]})
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json=body)
    assert answer.status_code == 422 and answer.headers["content-type"] == PROBLEM
    problem = answer.json()
    assert "no modules named ['c_attn']" in problem["detail"]
    assert problem["errors"][0]["field"] == "params.lora_targets"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert repr(name) in problem["detail"]
    assert count(Job) == before
    ok = client.post("/v1/unlearning-jobs", headers=auth(),
                     json=job_body(registered_model, forget_records[:2], params={"lora_targets": "q_proj,v_proj",
                                                                                  "max_steps": 1}))
    assert ok.status_code == 202, ok.text


def test_a_job_stores_its_specification_resolved_once(client, registered_model, forget_records):
    """The request as asked stays as evidence; what the worker runs is the specification, every default and the
    preset resolved at submission, with the curves on the job's own margin."""
    body = job_body(registered_model, forget_records, preset="tofu-llama2", params={"max_steps": 1, "k": 3},
                    mcu={"points": 3, "params": {"fit_steps": 2}})
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json=body)
    assert answer.status_code == 202, answer.text
    with session_scope() as session:
        job = session.get(Job, answer.json()["id"])
        assert job.params == {"max_steps": 1, "k": 3} and job.preset == "tofu-llama2"
        params, curves = job.spec["params"], job.spec["connectivity"]
    assert (params["method"], params["rho"], params["k"], params["max_steps"], params["batch_size"]) == \
        ("masc", 0.7, 3, 1, 2)
    assert (curves["points"], curves["fit_steps"], curves["k"], curves["rho"], curves["eta"]) == (3, 2, 3, 0.7, 0.25)


def test_oversize_body_is_413(client, registered_model):
    before = count(Job)
    huge = [{"prompt": "Q", "completion": "x" * 1000} for _ in range(3000)]  # about 3 MB, over the test limit
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={"model_id": registered_model["id"],
                                                                     "request_id": "big", "forget": huge})
    assert answer.status_code == 413 and answer.json()["type"].endswith("/payload-too-large")
    assert count(Job) == before


def test_bad_model_registrations(client, fixture_model, tmp_path):
    before = count(Model)
    cases = [
        ({"name": "x", "source": "/etc"}, 422, "outside the import roots"),
        ({"name": "x", "source": str(tmp_path / "missing")}, 422, "not a directory"),
        ({"name": "x", "source": str(tmp_path)}, 422, "no config.json"),
        ({"name": "bad name!", "source": str(fixture_model)}, 422, "name"),
        ({"name": "x", "source": str(fixture_model), "retain": [{"prompt": "Q"}]}, 422, "retain"),
        ({"name": "x", "source": "hf:org/model-that-cannot-be-fetched-here"}, 422, "cannot be fetched"),
        ({"name": "x", "source": str(tmp_path) + "\u0000x"}, 422, "source"),  # found by schemathesis: was a 500
        ({"name": "x", "source": "~no-such-user-here/model"}, 422, "can resolve"),  # so was this
    ]
    for body, status, words in cases:
        answer = client.post("/v1/models", headers=auth(), json=body)
        assert answer.status_code == status and words in answer.text, (body, answer.text)
    assert count(Model) == before
