"""Gradient ascent: minimise -NLL_f (SPEC section 4)."""
import worker.engine.methods.objectives as O


class GradientAscent:

    def __init__(self, params, policy, pad_id: int):
        self.params, self.policy, self.pad_id = params, policy, pad_id

    def loss(self, forget, retain):
        total = O.gradient_ascent(self.policy.logits(forget), forget.labels)
        return total, {"forget": total.item(), "total": total.item()}
