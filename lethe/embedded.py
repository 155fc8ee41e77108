"""`make run`: the API and a real Celery worker process on the embedded default (SQLite, a filesystem
broker, artifacts under .lethe/), with a demo model built and registered on first start."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

HOST, PORT = os.environ.get("LETHE_HOST", "127.0.0.1"), int(os.environ.get("LETHE_PORT", "8000"))
DEMO_PEOPLE, DEMO_FORGET_PEOPLE = 8, 2
# Small enough to build in seconds on a laptop CPU, large enough to memorise 40 facts.
DEMO_FIXTURE: dict[str, Any] = dict(seed=0, epochs=300, vocab_size=512, hidden_size=64, layers=2, heads=4)


def migrate(database_url: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config(str(Path(__file__).resolve().parents[1] / "alembic.ini"))
    config.attributes["database_url"] = database_url
    config.attributes["skip_logging"] = True
    command.upgrade(config, "head")


def admin_key(settings) -> str:
    if settings.admin_key:
        return settings.admin_key
    path = Path(".lethe/admin_key")
    if not path.exists():
        from lethe.service.api.auth import new_secret

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new_secret())
        path.chmod(0o600)
    return path.read_text().strip()


def demo_model(settings) -> str:
    """Build the demo fixture (seconds) and register it as model "demo"; returns its id."""
    from sqlalchemy import select

    from lethe.engine.contract.record_checks import normalise_records
    from lethe.engine.data.synthetic import synthetic_people
    from lethe.engine.model.fixture import FixtureConfig, build_fixture
    from lethe.service.domain.lineage import add_version
    from lethe.service.domain.sources import copy_source
    from lethe.service.infra.artifacts import artifact_store
    from lethe.service.infra.db import session_scope
    from lethe.service.infra.tables import Model, new_id

    with session_scope() as session:
        existing = session.scalar(select(Model).where(Model.tenant == settings.admin_tenant, Model.name == "demo"))
        if existing:
            return existing.id
    people = synthetic_people(DEMO_PEOPLE, seed=0)
    directory = Path(settings.import_roots[0]) / "demo-model"
    if not (directory / "lethe_fixture.json").exists():
        print("building the demo model (a small Qwen2 fixture that memorises a synthetic QA set)...", flush=True)
        build_fixture([r for p in people for r in p], directory,
                      FixtureConfig(**DEMO_FIXTURE), log=lambda _: None)
    demo = Path(".lethe/demo")
    demo.mkdir(parents=True, exist_ok=True)
    (demo / "forget.json").write_text(json.dumps([r for p in people[:DEMO_FORGET_PEOPLE] for r in p], indent=1))
    retain = normalise_records([r for p in people[DEMO_FORGET_PEOPLE:] for r in p], "retain")
    (demo / "retain.json").write_text(json.dumps(retain, indent=1))
    with session_scope() as session:
        model = Model(id=new_id("mdl"), tenant=settings.admin_tenant, name="demo", source=str(directory.resolve()),
                      description="Demo fixture: a synthetic QA set of fictitious people", retain_records=retain)
        session.add(model)
        session.flush()
        location = f"models/{model.id}/v1"
        manifest = copy_source(settings, artifact_store(settings), str(directory), location, settings.admin_tenant)
        add_version(session, model, location=location, manifest=manifest, parent=None, job_id=None,
                    request_id=None, tags=["source"])
        return model.id


def main() -> int:
    os.environ.setdefault("LETHE_ADMIN_KEY", "")
    from lethe.service.settings import get_settings

    settings = get_settings()
    migrate(settings.database_url)
    key = admin_key(settings)
    os.environ["LETHE_ADMIN_KEY"] = key
    get_settings.cache_clear()
    settings = get_settings()
    model_id = demo_model(settings)
    from lethe.service.api import ops

    supervisor = ops.worker_supervisor = WorkerSupervisor(settings.queue)
    worker = supervisor.process
    print(f"""
Lethe is serving on http://{HOST}:{PORT} (docs: http://{HOST}:{PORT}/docs), worker pid {worker.pid}.
Admin key: {key}
Demo model: {model_id}

  curl -s -H "Authorization: Bearer {key}" http://{HOST}:{PORT}/v1/models/{model_id}/versions
  python3 -c 'import json; print(json.dumps({{"model_id": "{model_id}", "request_id": "dsar-1", \
"forget": json.load(open(".lethe/demo/forget.json"))}}))' > /tmp/lethe-request.json
  curl -s -X POST -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
       -H "Idempotency-Key: dsar-1" --data @/tmp/lethe-request.json http://{HOST}:{PORT}/v1/unlearning-jobs
  make demo    # the same, scripted: submits, follows progress, downloads the new version
""", flush=True)
    # uvicorn re-raises the SIGTERM it handled once it has shut down; with the default handler that kills
    # this process before `finally` could stop the worker, which lives in its own session and would stay
    # behind to take the next run's jobs. An exception instead lets `finally` run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        import uvicorn

        supervisor.start()
        # Past this many open connections and tasks uvicorn answers 503 instead of queueing without bound.
        uvicorn.run("lethe.service.api.app:app", host=HOST, port=PORT, log_level="info", limit_concurrency=200)
    finally:
        supervisor.stop()
    return 0


class WorkerSupervisor(threading.Thread):
    """Keeps one worker process alive: a worker that died (killed, out of memory) is started again, and its
    job's lease lets the new one take the job over."""

    def __init__(self, queue: str):
        super().__init__(name="lethe-worker-supervisor", daemon=True)
        self.queue, self.stopping, self.restarts, self.lock = queue, threading.Event(), 0, threading.Lock()
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", "lethe.worker.celery_app", "worker",
                                 "-Q", self.queue, "-c", "1", "--pool", "prefork", "-n", "embedded@%h",
                                 "--loglevel", "INFO"],
                                env=os.environ.copy(), start_new_session=True)

    def alive(self) -> bool:
        return self.process.poll() is None

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            with self.lock:  # never start one while stop() runs: it would outlive the service
                if not self.alive() and not self.stopping.is_set():
                    code = self.process.returncode
                    self.restarts += 1
                    self.process = self._start()
                    print(f"the worker exited ({code}); restarted, worker pid {self.process.pid}", flush=True)

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
            stop_worker(self.process)


def stop_worker(worker: subprocess.Popen, grace: float = 10.0) -> None:
    """Warm shutdown first; a job still running after the grace period is killed, and its lease lets
    the next start take it over."""
    try:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=grace)
    except ProcessLookupError:  # already gone
        worker.wait()
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


if __name__ == "__main__":
    sys.exit(main())
