"""The typed result and its document (issue 27): the report is built from UnlearnResult, and a sharded run's rank 0
hands its result over as JSON, so the document must give the same result back."""
import json

import pytest

from lethe.engine.methods import params_for
from lethe.engine.training.result import BudgetEvidence, RuleEvidence, UnlearnResult
from lethe.engine.unlearn import run_unlearning

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


@pytest.mark.parametrize("method,values,cancel", [
    ("masc", {"max_steps": 3, "lr": 1e-3}, False),
    ("masc", {"max_steps": 3}, True),
    ("graddiff", {"epochs": 1, "effective_batch": 8}, False),
])
def test_the_document_gives_the_same_result_back(fixture_model, forget_records, retain_records, method, values,
                                                 cancel):
    outcome = run_unlearning(str(fixture_model), forget_records[:4], retain_records[:8],
                             params=params_for(method, values), should_cancel=(lambda: True) if cancel else None)
    result = outcome.result
    document = json.loads(json.dumps(result.as_dict()))  # as rank 0 writes it and the worker reads it
    again = UnlearnResult.from_dict(document)
    assert again.as_dict() == document
    assert (again.stop_reason, again.steps, again.final_violation_rate) == \
        (result.stop_reason, result.steps, result.final_violation_rate)
    assert isinstance(again.measured.evidence, RuleEvidence if method == "masc" else BudgetEvidence)
    assert (again.rule is None) == (method != "masc")
    if method == "masc":
        assert again.alpha == document["alpha"]["value"] and again.params["lambda_keep"] in (0.0, 3.0)
    else:
        assert again.alpha is None and again.params["lr"] == 1e-4  # resolved in the run: lr 0 asked
    assert cancel == (result.stop_reason == "cancelled")
    with pytest.raises(KeyError):
        UnlearnResult.from_dict({k: v for k, v in document.items() if k != "v_trace"})
