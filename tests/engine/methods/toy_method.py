"""A method that is not ours, as a user would add one: this module (its objective) and one registration
(tests/engine/contract/test_parameters.py and tests/engine/methods/test_baselines.py register it for the length
of a test)."""
import lethe.engine.methods.objectives as O
from lethe.engine.methods import Method
from lethe.engine.methods.baseline_params import BaselineParams


class ScaledAscent:
    """Gradient ascent on the forget answers, scaled by forget_weight."""

    def __init__(self, params, trainable, pad_id: int):
        self.params, self.trainable = params, trainable

    def loss(self, forget, retain):
        forget_term = O.gradient_ascent(self.trainable.logits(forget), forget.labels)
        return O.weighted(forget_term, self.params.forget_weight, None, 0.0)


TOY = Method("toy_ascent", "gradient ascent scaled by forget_weight (a test's method)", BaselineParams,
             "tests.engine.methods.toy_method:ScaledAscent", "fixed-budget",
             defaults={"forget_weight": 0.5, "epochs": 2.0})
