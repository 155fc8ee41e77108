"""Shared fixtures: a tiny synthetic QA set and a fixture model that has memorised it (built once)."""
import json

import pytest
import torch

from worker.engine.fixture import FixtureConfig, build_fixture
from worker.engine.synthetic import synthetic_people

# Modules that train models or drive the service end to end: `make test-fast` leaves them out (issue 13).
SLOW_MODULES = {"test_unlearning_end_to_end", "test_architectures", "test_baselines", "test_mcu", "test_audit",
                "test_cli", "test_calibration", "test_secrets"}


def pytest_collection_modifyitems(items):
    for item in items:
        if "service" in item.path.parts or item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


# The smallest model that still memorises 40 facts within seconds on two cores.
TINY = FixtureConfig(seed=0, epochs=300, vocab_size=512, hidden_size=64, layers=2, heads=4)


@pytest.fixture(scope="session")
def people():
    return synthetic_people(8, seed=0)


@pytest.fixture(scope="session")
def forget_records(people):
    return [r for p in people[:2] for r in p]


@pytest.fixture(scope="session")
def retain_records(people):
    return [r for p in people[2:] for r in p]


@pytest.fixture(scope="session")
def fixture_model(tmp_path_factory, people):
    torch.set_num_threads(2)
    out = tmp_path_factory.mktemp("fixture") / "model"
    summary = build_fixture([r for p in people for r in p], out, TINY, log=lambda _: None)
    assert summary["memorised_fraction"] == 1.0, summary
    return out


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
