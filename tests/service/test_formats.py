"""Record formats through the service (issue 14): a model registered with the chat format has its jobs' records
rendered with its tokenizer's chat template; the chat format is refused where the tokenizer has none."""
from pathlib import Path

import pytest  # noqa: I001

from lethe.service.infra.tables import Job, Model
from lethe.service.settings import get_settings
from tests.live_service import auth, wait_for
from tests.service.helpers import count

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

QUICK = {"params": {"lr": 1e-3, "max_steps": 4}, "audit": {"quantization": False, "relearn": False}}


def test_a_chat_model_runs_its_jobs_in_its_chat_format(client, worker, chat_fixture_model, fixture_model,
                                                        registered_model, forget_records):
    models, stored = count(Model), sorted(Path(get_settings().artifact_root).glob("models/*"))
    refused = client.post("/v1/models", headers=auth(), json={"name": "no-template", "source": str(fixture_model),
                                                              "format": "chat"})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "format", refused.text
    assert "no chat template" in refused.json()["detail"]
    assert count(Model) == models and sorted(Path(get_settings().artifact_root).glob("models/*")) == stored

    answer = client.post("/v1/models", headers=auth(), json={"name": "instruct", "source": str(chat_fixture_model),
                                                             "format": "chat"})
    assert answer.status_code == 201 and answer.json()["format"] == "chat", answer.text
    job = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": answer.json()["id"], "request_id": "dsar-chat", "forget": forget_records[:4], **QUICK}).json()
    done = wait_for(client, job["id"], timeout=300)
    assert done["state"] == "SUCCEEDED", done
    result = client.get(f"/v1/unlearning-jobs/{job['id']}/result", headers=auth()).json()
    assert result["format"] == "chat" and result["steps"] == 4
    assert client.get(f"/v1/unlearning-jobs/{job['id']}/report", headers=auth()).status_code == 200

    # A job on a model without a template cannot ask for the chat format.
    jobs = count(Job)
    refused = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "dsar-chat-2", "forget": forget_records[:2],
        "format": "chat"})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "format", refused.text
    bad = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "dsar-chat-3", "forget": forget_records[:2],
        "format": "markdown"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "format", bad.text
    assert count(Job) == jobs


def test_a_long_document_is_erased_window_by_window_and_reported_per_document(client, worker, registered_model,
                                                                             forget_records):
    long_text = " ".join(f"Kalo wrote letter {i} to the harbour master of Riga in the spring." for i in range(30))
    job = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "dsar-letters",
        "forget": [{"id": "letters", "text": long_text}, *forget_records[:2]],
        "params": {"lr": 1e-3, "max_steps": 4, "max_length": 64},
        "audit": {"quantization": False, "relearn": False}}).json()
    done = wait_for(client, job["id"], timeout=300)
    assert done["state"] == "SUCCEEDED", done
    report = client.get(f"/v1/unlearning-jobs/{job['id']}/report", headers=auth()).json()
    [document] = report["stop_rule"]["documents"]
    windows = [r["id"] for r in report["stop_rule"]["per_record"] if r["id"].startswith("letters#")]
    assert document["id"] == "letters" and document["windows"] == windows and len(windows) >= 3
    assert isinstance(document["meets_condition"], bool)
    assert done["forget"]["count"] == 3  # the evidence counts the request's records: the document is one
    page = client.get(f"/v1/unlearning-jobs/{job['id']}/report.html", headers=auth()).text
    assert f"1 long documents in {len(windows)} windows" in page
