"""`make run`'s embedded mode (SQLite, filesystem broker, a real worker process, the demo model)
serves a deletion request end to end, with no PostgreSQL or Redis involved."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_embedded_mode_serves_a_request_end_to_end(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env.update(PYTHONPATH=str(ROOT), LETHE_PORT=str(port))
    log = tmp_path / "run.log"
    server = subprocess.Popen([sys.executable, "-m", "service.embedded"], cwd=tmp_path, env=env,
                              stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        text = log.read_text()
        key = (tmp_path / ".lethe" / "admin_key").read_text().strip()
        assert f"Admin key: {key}" in text and "curl" in text
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        [demo] = client.get("/v1/models").json()["items"]
        forget = json.loads((tmp_path / ".lethe" / "demo" / "forget.json").read_text())
        job = client.post("/v1/unlearning-jobs", json={"model_id": demo["id"], "request_id": "embedded-1",
                                                       "forget": forget, "params": {"lr": 1e-3}}).json()
        while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            assert time.time() < deadline + 240, job
            time.sleep(0.5)
            job = client.get(f"/v1/unlearning-jobs/{job['id']}").json()
        assert job["state"] == "SUCCEEDED", (job, log.read_text()[-3000:])
        version = client.get(f"/v1/models/{demo['id']}/versions/{job['result']['model_version']}").json()
        assert version["erased_request_ids"] == ["embedded-1"] and version["parent"] == 1
        assert (tmp_path / ".lethe" / "lethe.db").exists()  # SQLite, not the test PostgreSQL
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    # SIGTERM to the server stops its worker too (it lives in a session of its own): none stays behind to
    # take the next run's jobs.
    found = re.search(r"worker pid (\d+)", log.read_text())
    assert found, log.read_text()[-3000:]
    worker_pid = int(found.group(1))
    gone = time.time() + 20
    while _alive(worker_pid) and time.time() < gone:
        time.sleep(0.5)
    if _alive(worker_pid):
        os.killpg(worker_pid, signal.SIGKILL)
        raise AssertionError(f"the worker {worker_pid} outlived the server")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
