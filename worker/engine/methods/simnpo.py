"""SimNPO (SPEC section 4): the reference-free, length-normalised NPO term, weighted, plus retain NLL."""
import worker.engine.methods.objectives as O


class SimNPO:

    def __init__(self, params, policy, pad_id: int):
        self.params, self.policy, self.pad_id = params, policy, pad_id

    def loss(self, forget, retain):
        p = self.params
        forget_term = O.simnpo(self.policy.logits(forget), forget.labels, p.beta, p.delta)
        retain_term = O.retain_nll(self.policy.logits(retain), retain.labels) if retain is not None else None
        return O.weighted(forget_term, p.forget_weight, retain_term, p.retain_weight)
