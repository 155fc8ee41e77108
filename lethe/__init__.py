"""Lethe: machine unlearning as a service. One package, four floors, each importing only those below it:

lethe.engine   the ground floor: MASC, the baselines, the forgetting audit, connectivity (pure torch)
lethe.service  the API, its domain, stores and reports (FastAPI, SQLAlchemy; the engine's torch-free contract only)
lethe.worker   the Celery worker: runs the engine on a job and records the outcome through the service's domain
lethe.client   the Python client and the `lethe` command (httpx; no torch, no service)

lethe.embedded (`make run`) and lethe.demo (`make demo`) compose them on one machine.
"""
