"""The worker: a Celery process that runs one job at a time under a lease (runner.py), with the engine below it
and the service's domain and stores beside it; it also dispatches webhooks and announces its device."""
