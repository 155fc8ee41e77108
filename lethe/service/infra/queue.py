"""The Celery app as both sides see it: the API sends `lethe.run_job`, the worker (lethe.worker.celery_app)
registers it. At-least-once delivery; the database lease makes a duplicate delivery do nothing."""
from __future__ import annotations

from functools import lru_cache

from celery import Celery

from lethe.service.infra.broker import TRANSPORT
from lethe.service.settings import Settings, get_settings

RUN_JOB = "lethe.run_job"


def make_celery(settings: Settings) -> Celery:
    app = Celery("lethe", broker=settings.broker_url)
    transport_options: dict = {"visibility_timeout": settings.visibility_timeout}
    if settings.broker_url.startswith("filesystem"):
        # Embedded mode: messages are files in a folder, no Redis needed.
        folder = settings.broker_dir.resolve()
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        # control_folder: kombu's default is ./control, in whatever folder the process runs from
        transport_options = {"data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
                             "processed_folder": str(folder / "processed"), "store_processed": False,
                             "control_folder": str(folder / "control")}
        app.conf.broker_transport = TRANSPORT  # messages taken in the order they were sent (lethe.service.infra.broker)
    app.conf.update(
        task_default_queue=settings.queue,
        task_routes={RUN_JOB: {"queue": settings.queue}},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        enable_utc=True,
    )
    return app


@lru_cache
def get_celery() -> Celery:
    return make_celery(get_settings())


def enqueue(job_id: str, countdown: float | None = None, queue: str | None = None) -> None:
    """Send the job to `queue` (the one it was routed to; None: the service's default queue)."""
    get_celery().send_task(RUN_JOB, args=[job_id], queue=queue or get_settings().queue, countdown=countdown)


def queue_depth() -> int | None:
    """Messages waiting in the queue, where the broker can say."""
    settings = get_settings()
    try:
        if settings.broker_url.startswith("filesystem"):
            return sum(1 for _ in (settings.broker_dir / "queue").glob("*"))
        with get_celery().connection_for_write() as connection:
            return connection.default_channel.client.llen(settings.queue)
    except Exception:  # the metric is best effort; readiness reports the broker itself
        return None


def broker_reachable() -> bool:
    settings = get_settings()
    if settings.broker_url.startswith("filesystem"):
        return (settings.broker_dir / "queue").is_dir()
    try:
        with get_celery().connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
        return True
    except Exception:
        return False
