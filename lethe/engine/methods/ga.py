"""Gradient ascent: minimise -NLL_f (SPEC section 4)."""
import lethe.engine.methods.objectives as O


class GradientAscent:

    def __init__(self, params, trainable, pad_id: int):
        self.params, self.trainable, self.pad_id = params, trainable, pad_id

    def loss(self, forget, retain):
        total = O.gradient_ascent(self.trainable.logits(forget), forget.labels)
        return total, {"forget": total.item(), "total": total.item()}
