"""S3 for real (issue 15): the artifact store and s3:// model sources against an S3 API server started here (moto's
server mode, a separate process speaking S3's HTTP protocol): multipart uploads of a file larger than one part,
Range reads, the bucket allow-list, and a whole deployment (API and worker processes) whose artifacts live in S3."""
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import httpx
import pytest

from lethe.service.infra.artifacts import artifact_store
from lethe.service.settings import Settings
from tests.client.test_client import free_port
from tests.live_service import ADMIN_KEY, ROOT, WorkerProcess, create_pg_database, drop_pg_database, migrate
from tests.live_service import pg_url as database_url

pytestmark = pytest.mark.slow
PART = 5 * 2**20  # S3's smallest part


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free port, with three buckets; the AWS_* variables point boto3 and s3fs at it."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    deadline = time.time() + 60
    while True:
        assert process.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        try:
            httpx.get(url)
            break
        except httpx.TransportError:
            time.sleep(0.2)
    client = boto3.client("s3", endpoint_url=url)
    for bucket in ("lethe-artifacts", "models-allowed", "models-other"):
        client.create_bucket(Bucket=bucket)
    yield url, client
    process.terminate()
    process.wait(timeout=30)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def settings_for(url: str, root: str) -> Settings:
    return Settings(artifact_root=root, s3_endpoint_url=url, s3_part_bytes=PART, s3_buckets=["models-allowed"])


def test_the_store_uploads_in_parts_and_reads_ranges(s3, tmp_path):
    url, client = s3
    big = os.urandom(2 * PART + 12345)  # three parts
    small = b"{}" * 100
    store = artifact_store(settings_for(url, "s3://lethe-artifacts/unit"))
    files = [("weights.bin", len(big), lambda: _reader(big)), ("sub/config.json", len(small), lambda: _reader(small))]
    manifest = store.put_files(files, "models/m1/v1")
    assert manifest == [{"path": "weights.bin", "size": len(big), "sha256": hashlib.sha256(big).hexdigest()},
                        {"path": "sub/config.json", "size": len(small), "sha256": hashlib.sha256(small).hexdigest()}]
    head = client.head_object(Bucket="lethe-artifacts", Key="unit/models/m1/v1/weights.bin")
    assert head["ContentLength"] == len(big) and head["ETag"].strip('"').endswith("-3")  # a multipart upload
    assert "-" not in client.head_object(Bucket="lethe-artifacts", Key="unit/models/m1/v1/sub/config.json")["ETag"]
    with store.open("models/m1/v1", "weights.bin") as handle:  # a Range read: the bytes asked for, no more
        handle.seek(PART + 7)
        assert handle.read(1000) == big[PART + 7:PART + 1007]
    copy = store.fetch_directory("models/m1/v1", tmp_path / "copy")
    assert (copy / "weights.bin").read_bytes() == big and (copy / "sub" / "config.json").read_bytes() == small
    store.delete("models/m1/v1")
    assert client.list_objects_v2(Bucket="lethe-artifacts", Prefix="unit/models/m1/")["KeyCount"] == 0


def _reader(data: bytes):
    import io

    return io.BytesIO(data)


@pytest.fixture(scope="module")
def deployment(s3, fixture_model, tmp_path_factory):
    """The API (uvicorn) and a worker, in their own processes, on their own database and queue, artifacts in S3."""
    url, client = s3
    base = tmp_path_factory.mktemp("s3-deployment")
    database = create_pg_database()
    env = {"LETHE_DATABASE_URL": database_url(database), "LETHE_BROKER_URL": "redis://127.0.0.1:6379/0",
           "LETHE_QUEUE": "s3-test-" + uuid.uuid4().hex[:8], "LETHE_ARTIFACT_ROOT": "s3://lethe-artifacts/svc",
           "LETHE_S3_ENDPOINT_URL": url, "LETHE_S3_PART_BYTES": str(PART),
           "LETHE_S3_BUCKETS": json.dumps(["models-allowed"]), "LETHE_IMPORT_ROOTS": json.dumps([str(base)]),
           "LETHE_ADMIN_KEY": ADMIN_KEY, "LETHE_AUDIT_KEY": "s3-audit-" + uuid.uuid4().hex, "LETHE_DEVICE": "cpu",
           "LETHE_HEARTBEAT_SECONDS": "0.5", "LETHE_LEASE_SECONDS": "10", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    migrate(env["LETHE_DATABASE_URL"])
    worker = WorkerProcess(env, base)
    worker.start()
    port = free_port()
    log = base / "api.log"
    api = subprocess.Popen([sys.executable, "-m", "uvicorn", "lethe.service.api.app:app", "--port", str(port)],
                           cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, stdout=log.open("w"),
                           stderr=subprocess.STDOUT, start_new_session=True)
    api_url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        assert api.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        try:
            if httpx.get(f"{api_url}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.3)
    # The model as a customer keeps it in S3, with a file larger than one part beside it.
    for path in Path(fixture_model).iterdir():
        client.upload_file(str(path), "models-allowed", f"tiny/{path.name}")
        client.upload_file(str(path), "models-other", f"tiny/{path.name}")
    padding = os.urandom(PART + 4321)
    client.put_object(Bucket="models-allowed", Key="tiny/extra/padding.bin", Body=padding)
    yield httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60), client, padding
    api.terminate()
    api.wait(timeout=30)
    worker.stop()
    drop_pg_database(database)


def test_a_deployment_on_s3_registers_unlearns_and_serves_ranges(deployment, forget_records):
    api, client, padding = deployment
    refused = api.post("/v1/models", json={"name": "other", "source": "s3://models-other/tiny"})
    assert refused.status_code == 422 and "models-other" in refused.json()["detail"]
    assert "LETHE_S3_BUCKETS" in refused.json()["detail"]
    model = api.post("/v1/models", json={"name": "tiny", "source": "s3://models-allowed/tiny"})
    assert model.status_code == 201, model.text
    model_id = model.json()["id"]
    stored = client.list_objects_v2(Bucket="lethe-artifacts", Prefix="svc/")["Contents"]
    padding_key = next(o["Key"] for o in stored if o["Key"].endswith("extra/padding.bin"))
    assert client.head_object(Bucket="lethe-artifacts", Key=padding_key)["ETag"].strip('"').endswith("-2")

    job = api.post("/v1/unlearning-jobs", json={"model_id": model_id, "request_id": "s3-dsar",
                                                "forget": forget_records[:4], "params": {"max_steps": 3},
                                                "audit": {"quantization": False, "relearn": False}})
    assert job.status_code == 202, job.text
    deadline = time.time() + 300
    while (state := api.get(f"/v1/unlearning-jobs/{job.json()['id']}").json())["state"] not in (
            "SUCCEEDED", "FAILED", "CANCELLED"):
        assert time.time() < deadline, state
        time.sleep(0.5)
    assert state["state"] == "SUCCEEDED", state
    version = state["result"]["model_version"]
    manifest = api.get(f"/v1/models/{model_id}/versions/{version}/files").json()["files"]
    weights = next(e for e in manifest if e["path"].endswith(".safetensors"))
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="lethe-artifacts", Prefix="svc/")["Contents"]]
    first = {o["Key"] for o in stored}  # version 1's files
    key = next(k for k in keys if k.endswith("/" + weights["path"]) and k not in first)
    body = client.get_object(Bucket="lethe-artifacts", Key=key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == weights["sha256"]  # the new version's weights, in S3
    part = api.get(f"/v1/models/{model_id}/versions/{version}/files/{weights['path']}",
                   headers={"Range": "bytes=100-1123"})
    assert part.status_code == 206 and part.content == body[100:1124]
    assert part.headers["Content-Range"] == f"bytes 100-1123/{len(body)}"
    whole = api.get(f"/v1/models/{model_id}/versions/1/files/extra/padding.bin")
    assert whole.status_code == 200 and whole.content == padding
