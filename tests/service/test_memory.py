"""Memory planning through the service (issue 15): workers announce their device's memory; a job whose model
cannot fit any of them is refused at submission with the estimate, one that the smallest fitting device cannot
hold once its records are counted fails at start with the estimate, before any weight is loaded."""
import uuid

import pytest
from sqlalchemy import select
from transformers import AutoModelForCausalLM, GPT2Config

from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Job, WorkerDevice
from tests.live_service import WorkerProcess, auth, wait_for
from tests.service.helpers import count

pytestmark = pytest.mark.slow


def devices() -> dict[str, WorkerDevice]:
    with session_scope() as session:
        rows = session.scalars(select(WorkerDevice)).all()
        session.expunge_all()
        return {r.queue: r for r in rows}


def test_the_session_worker_announces_its_device(worker, service_env):
    wait_until_announced(service_env["LETHE_QUEUE"])
    row = devices()[service_env["LETHE_QUEUE"]]
    assert row.capacity_bytes == 256 * 2**20 and row.device == "cpu" and row.auto_dtype == "float32"


def test_a_model_larger_than_every_device_is_refused_at_submission(client, worker, fixture_model, tmp_path,
                                                                   forget_records):
    # 77 M parameters (a vocabulary of 1.2 M rows of 64): 307 MB in float32, more than 256 MiB can plan on.
    source = tmp_path / "wide"
    config = GPT2Config(vocab_size=1_200_000, n_embd=64, n_layer=1, n_head=2, n_positions=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(source)
    for path in fixture_model.iterdir():  # the fixture's tokenizer
        if path.name.startswith(("tokenizer", "special_tokens")):
            (source / path.name).write_bytes(path.read_bytes())
    model = client.post("/v1/models", headers=auth(), json={"name": "wide-" + uuid.uuid4().hex[:6],
                                                            "source": str(source)})
    assert model.status_code == 201, model.text
    jobs = count(Job)
    refused = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model.json()["id"], "request_id": "too-large", "forget": forget_records[:2]})
    assert refused.status_code == 422, refused.text
    body = refused.json()
    parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())  # embeddings tied
    assert body["type"].endswith("/does-not-fit") and f"{parameters:,} parameters" in body["detail"]
    assert "0.29 GiB" in body["detail"] and 'dtype "bfloat16"' in body["detail"]
    assert body["estimate"]["parameters"] == parameters and body["estimate"]["parts"]["weights"] == parameters * 4
    assert not body["estimate"]["fits"] and count(Job) == jobs  # nothing was created
    # Full fine-tuning needs more still (gradients, moments, the frozen copy): refused with the larger figure.
    full = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model.json()["id"], "request_id": "too-large-full", "forget": forget_records[:2],
        "params": {"lora": False}})
    assert full.status_code == 422 and full.json()["estimate"]["peak_bytes"] == body["estimate"]["peak_bytes"] * 5


def test_a_job_too_large_for_its_worker_fails_at_start_with_the_estimate(client, worker, service_env,
                                                                         registered_model, forget_records,
                                                                         tmp_path):
    """A second worker on its own queue with 3 MiB: the tiny model's weights fit it (so the job is routed to the
    smallest device that holds them), its activations do not. The job ends FAILED with the estimate, and
    the worker went on (a later job on the session worker succeeds)."""
    small_queue = "small-" + uuid.uuid4().hex[:6]
    small = WorkerProcess({**service_env, "LETHE_QUEUE": small_queue, "LETHE_DEVICE_MEMORY_BYTES": str(3 * 2**20)},
                          tmp_path)
    small.start()
    try:
        wait_until_announced(small_queue)
        job = client.post("/v1/unlearning-jobs", headers=auth(), json={
            "model_id": registered_model["id"], "request_id": "too-large-at-start", "forget": forget_records[:4],
            "params": {"max_steps": 4}})
        assert job.status_code == 202, job.text
        with session_scope() as session:
            assert session.get_one(Job, job.json()["id"]).queue == small_queue
        done = wait_for(client, job.json()["id"], timeout=120)
        assert done["state"] == "FAILED", done
        error = done["error"]
        assert error["type"].endswith("/does-not-fit") and "does not fit" in error["detail"]
        assert error["estimate"]["capacity_bytes"] == 3 * 2**20 and error["estimate"]["peak_bytes"] * 1.1 > 3 * 2**20
        assert {"weights", "adapters_and_optimiser", "training_step", "measurement"} <= set(error["estimate"]["parts"])
        assert done["result"] is None or done["result"].get("model_version") is None
    finally:
        small.stop()
    assert small_queue not in devices()  # a worker that stops withdraws its announcement
    # Without the small worker the same job goes to the session worker, which holds it.
    again = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "fits-now", "forget": forget_records[:4],
        "params": {"max_steps": 2}, "audit": {"quantization": False, "relearn": False}})
    assert again.status_code == 202
    assert wait_for(client, again.json()["id"], timeout=240)["state"] == "SUCCEEDED"


def wait_until_announced(queue: str, timeout: float = 60) -> None:
    import time

    deadline = time.time() + timeout
    while queue not in devices():
        assert time.time() < deadline, "the worker did not announce its device"
        time.sleep(0.2)
