"""GradDiff: -gamma NLL_f + alpha NLL_r (SPEC section 4; gamma = forget_weight, alpha = retain_weight)."""
from worker.engine.margin import active_positions, token_nll
from worker.engine.methods import objectives as O


class GradDiff:
    name = "graddiff"

    def __init__(self, params, policy, pad_id: int):
        self.params, self.policy, self.pad_id = params, policy, pad_id

    def loss(self, forget, retain):
        p = self.params
        forget_term = O.gradient_ascent(self.policy.logits(forget), forget.labels)
        total = p.forget_weight * forget_term
        parts = {"forget": forget_term.item()}
        if retain is not None:
            retain_term = token_nll(*active_positions(self.policy.logits(retain), retain.labels)[:2])
            total = total + p.retain_weight * retain_term
            parts["retain"] = retain_term.item()
        return total, {**parts, "total": total.item()}
