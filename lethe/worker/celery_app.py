"""The Celery worker: `celery -A lethe.worker.celery_app worker -Q gpu -c 1 --pool prefork`. CUDA is never
touched before the fork: the engine (and torch) load in the pool child, where CUDA may start."""
import os

# The worker reads models from the artifact store only: nothing is fetched from the Hub on a model's behalf
# (issue 26). Set before transformers or huggingface_hub is imported, which read these once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from celery.signals import worker_process_init, worker_process_shutdown  # noqa: E402

from lethe.service.infra.queue import RUN_JOB, get_celery  # noqa: E402
from lethe.service.settings import get_settings  # noqa: E402

app = get_celery()
# A job past LETHE_MAX_JOB_SECONDS stops at its next heartbeat (lethe.worker.work.LeaseKeeper); one stuck inside a step
# for this much longer is killed with its pool child, and its next delivery ends it FAILED (time-limit).
TIME_LIMIT_GRACE = 600.0
MAX_JOB_SECONDS = get_settings().max_job_seconds
HARD_LIMIT = MAX_JOB_SECONDS + TIME_LIMIT_GRACE if MAX_JOB_SECONDS > 0 else None


@worker_process_init.connect
def preload_engine(**_):
    """Import the engine in each pool child as it starts (importing torch does not initialise CUDA),
    so that the first job does not pay for the imports."""
    import lethe.engine.unlearn  # noqa: F401
    import lethe.worker.runner  # noqa: F401
    from lethe.worker.devices import start_announcer
    from lethe.worker.webhooks import start_dispatcher

    start_dispatcher()  # the worker side delivers the webhooks (issue 14)
    start_announcer()  # its device's memory, for the API's routing (issue 15)


@worker_process_shutdown.connect
def withdraw_device(**_):
    from lethe.worker.devices import withdraw

    withdraw()


@app.task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True, time_limit=HARD_LIMIT)
def run_job(job_id: str) -> str:
    from lethe.worker.runner import run

    return run(job_id)
