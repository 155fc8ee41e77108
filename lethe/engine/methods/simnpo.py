"""SimNPO (SPEC section 4): the reference-free, length-normalised NPO term, weighted, plus retain NLL."""
import lethe.engine.methods.objectives as O


class SimNPO:

    def __init__(self, params, trainable, pad_id: int):
        self.params, self.trainable, self.pad_id = params, trainable, pad_id

    def loss(self, forget, retain):
        p = self.params
        forget_term = O.simnpo(self.trainable.logits(forget), forget.labels, p.beta, p.delta)
        retain_term = O.retain_nll(self.trainable.logits(retain), retain.labels) if retain is not None else None
        return O.weighted(forget_term, p.forget_weight, retain_term, p.retain_weight)
