"""Lethe's unlearning engine, the ground floor: pure torch/transformers (no FastAPI, Celery or SQLAlchemy), and
nothing above it (service, worker, client) is imported here.

contract/      torch-free: errors, parameters, the job specification, record checks, chat format, memory plan
data/          records, documents, secrets, counterfactual text, synthetic sets
model/         loading, the trainable model, LoRA targets, precision, devices, sharding, generation, fixtures
methods/       the registry, MASC (methods/masc/) and the fixed-budget baselines beside it
training/      the one loop every method shares, the run's setup and its typed result
audit/         the forgetting audit: metrics, extraction, degeneration, quantisation, relearning, verdict
connectivity/  mode connectivity between two versions (paths, the Bezier fit, barriers)

Entry points: `run_unlearning` (lethe.engine.unlearn), `build_fixture` (lethe.engine.model.fixture), and the CLI
`python -m lethe.engine`.
"""
