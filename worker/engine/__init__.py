"""Lethe's unlearning engine: pure torch/transformers (no FastAPI, Celery or SQLAlchemy).

Entry points: `run_unlearning` (worker.engine.unlearn), `build_fixture` (worker.engine.fixture),
and the CLI `python -m worker.engine`.
"""
