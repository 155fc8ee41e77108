"""Lethe's REST service: FastAPI routes thin over a SQLAlchemy data layer and a Celery queue."""
