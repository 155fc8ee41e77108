"""The service against real parts: a fresh PostgreSQL database, Redis as the broker, a Celery worker
subprocess, and the FastAPI app (with its sweeper) in process. Nothing here is mocked or skipped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
ADMIN_KEY = "lth_test_admin_" + uuid.uuid4().hex


def pg_url(name: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def create_pg_database() -> str:
    name = "lethe_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_pg_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate(url: str, target: str = "head", down: bool = False) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["database_url"] = url
    config.attributes["skip_logging"] = True
    (command.downgrade if down else command.upgrade)(config, target)


def clear_caches() -> None:
    from lethe.service import settings
    from lethe.service.infra import db, queue

    settings.get_settings.cache_clear()
    db.get_engine.cache_clear()
    db._sessions.cache_clear()
    queue.get_celery.cache_clear()


@pytest.fixture(scope="session")
def service_env(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    database = create_pg_database()
    env = {
        "LETHE_DATABASE_URL": pg_url(database),
        "LETHE_BROKER_URL": "redis://127.0.0.1:6379/0",
        "LETHE_QUEUE": "gpu-test-" + uuid.uuid4().hex[:8],  # this run's own queue on the shared Redis
        "LETHE_ARTIFACT_ROOT": str(base / "artifacts"),
        "LETHE_IMPORT_ROOTS": json.dumps([str(base)]),
        "LETHE_ADMIN_KEY": ADMIN_KEY,
        "LETHE_AUDIT_KEY": "test-audit-" + uuid.uuid4().hex,
        "LETHE_MAX_ACTIVE_JOBS": "500",  # modules leave queued jobs until their end; the quota has its own test
        "LETHE_LEASE_SECONDS": "4",
        "LETHE_HEARTBEAT_SECONDS": "0.5",
        "LETHE_SWEEP_SECONDS": "1",
        "LETHE_MAX_BODY_BYTES": str(2 * 2**20),
        "LETHE_DEVICE": "cpu",
        # The session worker announces 256 MiB (test_memory registers a model larger than that).
        "LETHE_DEVICE_MEMORY_BYTES": str(256 * 2**20),
        # Webhooks to the tests' receiver on 127.0.0.1, retried within seconds (0.2, 0.4, ... 3.2 s: 6 attempts).
        "LETHE_WEBHOOK_ALLOW_PRIVATE": "true",
        "LETHE_WEBHOOK_BACKOFF_SECONDS": "0.2",
        "LETHE_WEBHOOK_MAX_ATTEMPTS": "6",
        "LETHE_WEBHOOK_POLL_SECONDS": "0.2",
        "LETHE_WEBHOOK_TIMEOUT_SECONDS": "3",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    clear_caches()
    migrate(env["LETHE_DATABASE_URL"])
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    from lethe.service.infra.db import get_engine

    get_engine().dispose()
    clear_caches()
    drop_pg_database(database)


class WorkerProcess:
    """A real `celery worker` subprocess on this run's queue; it can be SIGKILLed and started again."""

    def __init__(self, env: dict, log_dir: Path):
        self.env, self.log_dir, self.proc, self.starts = env, log_dir, None, 0

    def start(self) -> None:
        self.starts += 1
        self.log = self.log_dir / f"worker-{self.starts}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "lethe.worker.celery_app", "worker", "-Q", self.env["LETHE_QUEUE"],
             "-c", "1", "--pool", "prefork", "-n", f"test{self.starts}-{uuid.uuid4().hex[:6]}@%h",
             "--loglevel", "INFO"],
            cwd=ROOT, env={**os.environ, **self.env, "PYTHONPATH": str(ROOT)}, stdout=self.log.open("w"),
            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while "ready." not in self.log.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the worker and its pool children at once: no warm shutdown, no ack."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def worker(service_env, tmp_path_factory):
    process = WorkerProcess(service_env, tmp_path_factory.mktemp("worker-logs"))
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def client(service_env):
    from fastapi.testclient import TestClient

    from lethe.service.api.app import create_app

    with TestClient(create_app()) as test_client:
        yield test_client


def auth(key: str = ADMIN_KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def registered_model(client, fixture_model, retain_records):
    answer = client.post("/v1/models", headers=auth(), json={"name": "tiny-" + uuid.uuid4().hex[:6],
                                                            "source": str(fixture_model), "retain": retain_records})
    assert answer.status_code == 201, answer.text
    return answer.json()


@pytest.fixture(scope="module")
def cancel_leftovers(registered_model):
    """For modules that create jobs they do not run: cancel them at the end, so that the worker of a
    later module does not spend its time on them."""
    yield
    from lethe.service.domain.jobs import end_job
    from lethe.service.infra.db import session_scope
    from lethe.service.infra.tables import Job

    with session_scope() as session:
        for job in session.query(Job).filter(Job.model_id == registered_model["id"], Job.state == "QUEUED"):
            end_job(job, "CANCELLED")


def wait_for(client, job_id: str, states=("SUCCEEDED", "FAILED", "CANCELLED"), timeout: float = 240,
             condition=None) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.get(f"/v1/unlearning-jobs/{job_id}", headers=auth()).json()
        if job["state"] in states and (condition is None or condition(job)):
            return job
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} did not reach {states}: {job}")
