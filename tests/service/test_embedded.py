"""`make run`'s embedded mode (SQLite, filesystem broker, a real worker process, the demo model)
serves a deletion request end to end, with no PostgreSQL or Redis involved; stopped by SIGTERM or SIGINT
it leaves no process behind, a dead worker is restarted, and a restart of the whole service with a job
running still ends the job SUCCEEDED exactly once (issue 12)."""
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
import pytest  # noqa: I001

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Embedded:
    """`python -m lethe.embedded` in a folder of its own, as `make run` starts it."""

    def __init__(self, folder: Path, port: int, run: int = 1, **settings: str):
        self.folder, self.port, self.base = folder, port, f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
        env.update(PYTHONPATH=str(ROOT), LETHE_PORT=str(port), **settings)
        self.log = folder / f"run-{run}.log"
        self.server = subprocess.Popen([sys.executable, "-m", "lethe.embedded"], cwd=folder, env=env,
                                       stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 180
        while True:
            assert self.server.poll() is None, self.text()[-3000:]
            assert time.time() < deadline, self.text()[-3000:]
            try:
                if httpx.get(f"{self.base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        key = (folder / ".lethe" / "admin_key").read_text().strip()
        self.client = httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {key}"}, timeout=30)

    def text(self) -> str:
        return self.log.read_text()

    def worker_pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"worker pid (\d+)", self.text())]

    def stop(self, sig=signal.SIGTERM) -> None:
        """Stop the server as a process manager would (one signal to the server), then check that none of
        the workers it started is left to take the next run's jobs."""
        os.kill(self.server.pid, sig)
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            raise AssertionError(f"the server ignored {sig!r}:\n{self.text()[-3000:]}") from None
        pids = self.worker_pids()
        assert pids, self.text()[-3000:]
        gone = time.time() + 20
        while any(_alive(p) for p in pids) and time.time() < gone:
            time.sleep(0.5)
        left = [p for p in pids if _alive(p)]
        for p in left:
            os.killpg(p, signal.SIGKILL)
        assert not left, f"worker(s) {left} outlived the server stopped by {sig!r}"

    def wait(self, job_id: str, until=("SUCCEEDED", "FAILED", "CANCELLED"), condition=None, timeout=300) -> dict:
        deadline = time.time() + timeout
        while True:
            job = self.client.get(f"/v1/unlearning-jobs/{job_id}").json()
            if job["state"] in until and (condition is None or condition(job)):
                return job
            assert time.time() < deadline, (job, self.text()[-3000:])
            time.sleep(0.5)


def test_embedded_mode_serves_a_request_end_to_end(tmp_path):
    service = Embedded(tmp_path, free_port())
    try:
        key = (tmp_path / ".lethe" / "admin_key").read_text().strip()
        assert f"Admin key: {key}" in service.text() and "curl" in service.text()
        [demo] = service.client.get("/v1/models").json()["items"]
        # Issue 14's one command, on a fresh `make run`, as a user types it in its folder (the key found in
        # .lethe/admin_key): from a file to a verified checkpoint and a report, with progress.
        env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
        done = subprocess.run([sys.executable, "-m", "lethe.client.cli", "erase", "--model", "demo", "--forget",
                               ".lethe/demo/forget.json", "--request-id", "embedded-1", "--param", "lr=1e-3",
                               "--wait", "--download", "out", "--report", "report.html"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env={**env, "PYTHONPATH": str(ROOT), "LETHE_URL": service.base,
                                   "LETHE_CONFIG": str(tmp_path / "none.json")})
        assert done.returncode == 0, (done.stdout, done.stderr, service.text()[-3000:])
        assert "step" in done.stderr and "sha256 verified" in done.stdout
        [job] = service.client.get("/v1/unlearning-jobs").json()["items"]
        assert job["state"] == "SUCCEEDED" and job["request_id"] == "embedded-1"
        version = service.client.get(f"/v1/models/{demo['id']}/versions/{job['result']['model_version']}").json()
        assert version["erased_request_ids"] == ["embedded-1"] and version["parent"] == 1
        files = service.client.get(f"/v1/models/{demo['id']}/versions/{version['number']}/files").json()["files"]
        assert sorted(f["path"] for f in files) == sorted(str(p.relative_to(tmp_path / "out"))
                                                          for p in (tmp_path / "out").rglob("*") if p.is_file())
        assert 'id="verdict"' in (tmp_path / "report.html").read_text()
        assert (tmp_path / ".lethe" / "lethe.db").exists()  # SQLite, not the test PostgreSQL
        assert service.client.get("/readyz").json()["checks"]["worker"] == "ok"
    finally:
        service.stop(signal.SIGTERM)


# A lease of seconds, not a minute: a dead worker's job is taken over soon.
QUICK = dict(LETHE_LEASE_SECONDS="4", LETHE_HEARTBEAT_SECONDS="0.5", LETHE_SWEEP_SECONDS="1")


def test_a_dead_worker_is_restarted_and_a_restarted_service_finishes_its_job_once(tmp_path):
    port = free_port()
    service = Embedded(tmp_path, port, **QUICK)
    try:
        [demo] = service.client.get("/v1/models").json()["items"]
        forget = json.loads((tmp_path / ".lethe" / "demo" / "forget.json").read_text())
        # Runs to max_steps (no check before it): long enough to be interrupted twice.
        params = {"lr": 1e-3, "max_steps": 400, "check_every": 1000}
        job = service.client.post("/v1/unlearning-jobs", json={"model_id": demo["id"], "request_id": "fault-1",
                                                               "forget": forget, "params": params}).json()
        service.wait(job["id"], until=("RUNNING",), condition=lambda j: (j["progress"].get("step") or 0) > 5)
        # The worker dies mid-training: the supervisor starts another, /readyz says so, the job goes on.
        first = service.worker_pids()[-1]
        os.killpg(first, signal.SIGKILL)
        deadline = time.time() + 30
        while len(service.worker_pids()) < 2:
            assert time.time() < deadline, service.text()[-3000:]
            time.sleep(0.5)
        assert service.worker_pids()[-1] != first and "restarted" in service.text()
        assert service.client.get("/readyz").json()["checks"]["worker"] == "ok"
        service.wait(job["id"], until=("RUNNING",), condition=lambda j: j["attempt"] == 2, timeout=120)
    finally:
        service.stop(signal.SIGINT)  # Ctrl-C, with the job running
    # The whole service again, in the same folder: the job is taken over and ends SUCCEEDED exactly once.
    service = Embedded(tmp_path, port, run=2, **QUICK)
    try:
        done = service.wait(job["id"], timeout=400)
        assert done["state"] == "SUCCEEDED", (done, service.text()[-3000:])
        assert done["attempt"] == 3 and done["result"]["steps"] == 400
        numbers = [v["number"] for v in service.client.get(f"/v1/models/{demo['id']}/versions").json()["items"]]
        assert numbers == [1, 2]  # one version for the job, contiguous
    finally:
        service.stop(signal.SIGTERM)


def test_make_demo_without_a_key_says_where_the_key_comes_from(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    done = subprocess.run([sys.executable, "-m", "lethe.demo"], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "LETHE_ADMIN_KEY" in done.stderr and ".lethe/admin_key" in done.stderr
