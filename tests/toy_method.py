"""A method that is not ours, as a user would add one: this module (its objective) and one registration
(tests/test_contract.py and tests/test_baselines.py register it for the length of a test)."""
import worker.engine.methods.objectives as O
from worker.engine.baseline_params import BaselineParams
from worker.engine.methods import Method


class ScaledAscent:
    """Gradient ascent on the forget answers, scaled by forget_weight."""

    def __init__(self, params, policy, pad_id: int):
        self.params, self.policy = params, policy

    def loss(self, forget, retain):
        forget_term = O.gradient_ascent(self.policy.logits(forget), forget.labels)
        return O.weighted(forget_term, self.params.forget_weight, None, 0.0)


TOY = Method("toy_ascent", "gradient ascent scaled by forget_weight (a test's method)", BaselineParams,
             "tests.toy_method:ScaledAscent", "fixed-budget", defaults={"forget_weight": 0.5, "epochs": 2.0})
