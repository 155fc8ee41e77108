"""Shared fixtures: a tiny synthetic QA set and a fixture model that has memorised it (built once)."""
import json

import pytest
import torch

from lethe.engine.data.synthetic import synthetic_people
from lethe.engine.model.fixture import FixtureConfig, build_fixture

# The real service (PostgreSQL, Redis, a worker process) for the tests that ask for it: tests/service, tests/client.
pytest_plugins = ["tests.live_service"]


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


# A chat template in plain-text markers (the fixture's tokenizer has no chat special tokens): a user turn, then the
# assistant's, which ends with the EOS token.
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}User: {{ m['content'] }}\n"
                 "{% else %}Assistant: {{ m['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}Assistant:{% endif %}")


@pytest.fixture(scope="session")
def chat_fixture_model(tmp_path_factory, fixture_model):
    """The fixture model with a chat template in its tokenizer, saved as any instruct model ships it."""
    import shutil

    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("chat-fixture") / "model"
    shutil.copytree(fixture_model, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    return out


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
