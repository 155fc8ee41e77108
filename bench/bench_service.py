"""`make bench-service`: the service as deployed here (uvicorn, a Celery worker, PostgreSQL, Redis):
GET-job latency under 100 concurrent clients, time from POST to RUNNING, archive download throughput
against reading the same files from disk. Prints figures and writes bench/results/service.json."""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "service.json"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
CLIENTS, SECONDS = 100, 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """A fresh database, this run's own Redis queue, uvicorn and one worker, torn down at the end."""

    def __init__(self, work: Path):
        self.work, self.database = work, "lethe_bench_" + uuid.uuid4().hex[:8]
        self.port, self.key = free_port(), "lth_bench_" + uuid.uuid4().hex
        self.env = {**os.environ, "PYTHONPATH": str(ROOT),
                    "LETHE_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:5432/{self.database}",
                    "LETHE_BROKER_URL": "redis://127.0.0.1:6379/0", "LETHE_QUEUE": "gpu-bench-" + uuid.uuid4().hex[:6],
                    "LETHE_ARTIFACT_ROOT": str(work / "artifacts"), "LETHE_IMPORT_ROOTS": json.dumps([str(work)]),
                    "LETHE_ADMIN_KEY": self.key, "LETHE_DEVICE": "cpu", "LETHE_MAX_BODY_BYTES": str(64 * 2**20)}
        self.processes: list[subprocess.Popen] = []

    def __enter__(self):
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=ROOT, env=self.env, check=True)
        self.start([sys.executable, "-m", "uvicorn", "lethe.service.api.app:app", "--port", str(self.port),
                    "--log-level", "warning"])
        self.start([sys.executable, "-m", "celery", "-A", "lethe.worker.celery_app", "worker", "-Q",
                    self.env["LETHE_QUEUE"], "-c", "1", "--pool", "prefork", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h",
                    "--loglevel", "INFO"])
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60,
                                   headers={"Authorization": f"Bearer {self.key}"})
        for _ in range(300):
            try:
                if self.client.get("/readyz").status_code == 200 and "ready." in (self.work / "1.log").read_text():
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        time.sleep(5)  # the pool child preloads the engine after the worker says ready
        return self

    def start(self, command: list[str]) -> None:
        log = (self.work / f"{len(self.processes)}.log").open("w")
        self.processes.append(subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def __exit__(self, *_):
        for process in self.processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def register(self, name: str, source: Path, retain=None) -> dict:
        answer = self.client.post("/v1/models", json={"name": name, "source": str(source), "retain": retain})
        answer.raise_for_status()
        return answer.json()


def post_to_running(stack: Stack, model: dict, forget: list[dict], runs: int = 8) -> dict:
    """Server timestamps: created_at (the POST's insert) to started_at (the worker's lease)."""
    seconds = []
    for i in range(runs):
        job = stack.client.post("/v1/unlearning-jobs", json={"model_id": model["id"],
                                                             "request_id": f"latency-{i}", "forget": forget,
                                                             "params": {"max_steps": 2}}).json()
        while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            time.sleep(0.05)
            job = stack.client.get(f"/v1/unlearning-jobs/{job['id']}").json()
        created = job["created_at"].replace("Z", "+00:00")
        started = job["started_at"].replace("Z", "+00:00")
        from datetime import datetime
        seconds.append((datetime.fromisoformat(started) - datetime.fromisoformat(created)).total_seconds())
    return {"runs": runs, "median_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3),
            "first_s": round(seconds[0], 3), "note": "idle worker; the first includes the child's first imports"}


# wrk (C, from Debian) generates the load: a Python client on these two cores measures itself.
PACED = """
math.randomseed(os.time())
function delay() return math.random(500, 1500) end
"""


def hammer(url: str, key: str, clients: int, seconds: int, paced: bool) -> dict:
    """`clients` connections polling one job: back to back, or each about once a second (random
    0.5-1.5 s apart, so that they do not fire in lockstep)."""
    command = ["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--latency", "-H", f"Authorization: Bearer {key}"]
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        if paced:
            script.write(PACED)
            script.flush()
            command += ["-s", script.name]
        out = subprocess.run(command + [url], capture_output=True, text=True, check=True).stdout
    def field(prefix: str) -> str:
        return next(line.split()[1] for line in out.splitlines() if line.strip().startswith(prefix))

    def ms(text: str) -> float:
        for unit, scale in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
            if text.endswith(unit):
                return round(float(text[:-len(unit)]) * scale, 2)
        raise ValueError(text)

    errors = [line for line in out.splitlines() if "Non-2xx" in line or "Socket errors" in line]
    return {"clients": clients, "seconds": seconds, "paced": paced, "throughput_rps": float(field("Requests/sec:")),
            "p50_ms": ms(field("50%")), "p99_ms": ms(field("99%")), "errors": errors}


def archive_throughput(stack: Stack, size_mb: int = 256) -> dict:
    source = stack.work / "big-model"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with (source / "model.safetensors").open("wb") as handle:
        for _ in range(size_mb):
            handle.write(os.urandom(2**20))
    model = stack.register("big", source)
    stored = Path(stack.env["LETHE_ARTIFACT_ROOT"]) / "models" / model["id"] / "v1"
    files = sorted(p for p in stored.rglob("*") if p.is_file())

    def from_disk() -> int:
        total = 0
        for path in files:
            with path.open("rb") as handle:
                while chunk := handle.read(2**20):
                    total += len(chunk)
        return total

    def over_http() -> int:
        # curl as the client: a Python client would measure its own parsing speed.
        out = subprocess.run(["curl", "-sf", "-o", "/dev/null", "-w", "%{size_download}", "-H",
                              f"Authorization: Bearer {stack.key}",
                              f"{stack.client.base_url}/v1/models/{model['id']}/versions/1/archive"],
                             capture_output=True, text=True, check=True)
        return int(out.stdout)

    def drop_page_cache() -> bool:
        try:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3")
            return True
        except OSError:
            return False

    rows = {}
    for cache in ("warm", "cold"):
        for name, fn in (("disk", from_disk), ("archive", over_http)):
            fn()  # warm the page cache and the server
            timings = []
            for _ in range(3):
                if cache == "cold" and not drop_page_cache():
                    break
                started = time.perf_counter()
                nbytes = fn()
                timings.append(time.perf_counter() - started)
            if timings:
                rows[f"{name}_{cache}"] = {"bytes": nbytes,
                                           "mb_per_s": round(nbytes / 2**20 / statistics.median(timings), 1)}
        if f"archive_{cache}" in rows:
            rows[f"ratio_{cache}"] = round(rows[f"archive_{cache}"]["mb_per_s"] / rows[f"disk_{cache}"]["mb_per_s"], 3)
    return rows


def main() -> None:
    from lethe.engine.data.synthetic import synthetic_people
    from lethe.engine.model.fixture import FixtureConfig, build_fixture

    work = Path(tempfile.mkdtemp(prefix="lethe-bench-"))
    try:
        people = synthetic_people(8, seed=0)
        build_fixture([r for p in people for r in p], work / "tiny",
                      FixtureConfig(seed=0, epochs=300, vocab_size=512, hidden_size=64, layers=2, heads=4),
                      log=lambda _: None)
        with Stack(work) as stack:
            model = stack.register("tiny", work / "tiny", retain=[r for p in people[2:] for r in p])
            forget = [r for p in people[:2] for r in p]
            report = {"command": "make bench-service", "machine": f"{platform.machine()}, {os.cpu_count()} cores; "
                      "load generator, API, worker, PostgreSQL and Redis share them",
                      "server": "uvicorn, 1 process"}
            report["post_to_running"] = post_to_running(stack, model, forget)
            job_id = stack.client.get("/v1/unlearning-jobs", params={"page_size": 1}).json()["items"][0]["id"]
            url = f"{stack.client.base_url}/v1/unlearning-jobs/{job_id}"
            report["get_job_one_client"] = hammer(url, stack.key, 1, 10, paced=False)
            report["get_job_closed_loop"] = hammer(url, stack.key, CLIENTS, SECONDS, paced=False)
            report["get_job_polling_every_1s"] = hammer(url, stack.key, CLIENTS, SECONDS, paced=True)
            report["archive_download"] = archive_throughput(stack)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    p = report["post_to_running"]
    print(f"POST -> RUNNING: median {p['median_s']} s, max {p['max_s']} s over {p['runs']} jobs (target <= 1 s)")
    for name in ("get_job_one_client", "get_job_closed_loop", "get_job_polling_every_1s"):
        r = report[name]
        print(f"GET job, {r['clients']} client(s), {name.split('_', 2)[2].replace('_', ' ')}: p50 {r['p50_ms']} ms, "
              f"p99 {r['p99_ms']} ms, {r['throughput_rps']} req/s, errors: {r['errors'] or 'none'} "
              f"(target p99 <= 25 ms)")
    a = report["archive_download"]
    for cache in ("warm", "cold"):
        if f"ratio_{cache}" in a:
            print(f"archive download, {cache} page cache: {a[f'archive_{cache}']['mb_per_s']} MB/s vs reading the "
                  f"files {a[f'disk_{cache}']['mb_per_s']} MB/s: {a[f'ratio_{cache}']:.0%} (target >= 50%)")
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
