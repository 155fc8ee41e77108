"""GradDiff: -gamma NLL_f + alpha NLL_r (SPEC section 4; gamma = forget_weight, alpha = retain_weight)."""
import lethe.engine.methods.objectives as O


class GradDiff:

    def __init__(self, params, trainable, pad_id: int):
        self.params, self.trainable, self.pad_id = params, trainable, pad_id

    def loss(self, forget, retain):
        p = self.params
        forget_term = O.gradient_ascent(self.trainable.logits(forget), forget.labels)
        retain_term = O.retain_nll(self.trainable.logits(retain), retain.labels) if retain is not None else None
        return O.weighted(forget_term, p.forget_weight, retain_term, p.retain_weight)
