"""`python -m bench.bench_wear`: points along one run at its start, every N steps and at its end, the last one the
margins of the version the run returns."""
import statistics

import pytest
import torch

from bench.bench_wear import traced_run
from bench.utility_margins import weakest_margins
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import encode_records
from lethe.engine.model.loading import load_tokenizer

pytestmark = pytest.mark.slow  # trains the fixture model a few steps


def test_points_at_the_start_every_n_steps_and_the_end(fixture_model, forget_records, retain_records):
    tokenizer = load_tokenizer(fixture_model)
    utility = encode_records(normalise_records(retain_records[-6:], "retain"), tokenizer, max_length=512, seed=0,
                             what="retain")
    outcome, points = traced_run(str(fixture_model), forget_records[:4], retain_records[:10], utility,
                                 {"max_steps": 5, "lr": 3e-3}, every=2, log=lambda _: None)
    assert [p["step"] for p in points] == [0, 2, 4, 5]
    assert points[0]["forget_hinge"] > 0 and 0 <= points[0]["span_probability"] <= 1
    with torch.no_grad():
        final = weakest_margins(outcome.model.eval(), utility, tokenizer.pad_token_id)
    assert points[-1]["median"] == pytest.approx(statistics.median(final), abs=0.02)
    assert points[0]["median"] != points[-1]["median"]  # the run moved them
