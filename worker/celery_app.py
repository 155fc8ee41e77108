"""The Celery worker: `celery -A worker.celery_app worker -Q gpu -c 1`. CUDA is never touched here or
at import: the engine (and torch) load inside the task, in the forked child."""
from service.queue import RUN_JOB, get_celery

app = get_celery()


@app.task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True)
def run_job(job_id: str) -> str:
    from worker.runner import run

    return run(job_id)
