"""NPO and NPO+KL (SPEC section 4): the NPO forget term against pi_ref, plus retain NLL (NPO) or
KL(pi_ref || pi_theta) on retain tokens (NPO+KL)."""
import lethe.engine.methods.objectives as O
from lethe.engine.methods.masc import margin as M


class NPO:
    retain_kl = False

    def __init__(self, params, trainable, pad_id: int):
        self.params, self.trainable, self.pad_id = params, trainable, pad_id

    def loss(self, forget, retain):
        p = self.params
        forget_term = O.npo(self.trainable.logits(forget), self.trainable.reference_logits(forget), forget.labels,
                            p.beta)
        retain_term = None
        if retain is not None:
            if self.retain_kl:
                z, _, _ = M.active_positions(self.trainable.logits(retain), retain.labels)
                z0, _, _ = M.active_positions(self.trainable.anchor_logits(retain), retain.labels)
                retain_term = M.masked_kl(z0, z)
            else:
                retain_term = O.retain_nll(self.trainable.logits(retain), retain.labels)
        return O.weighted(forget_term, 1.0, retain_term, p.retain_weight)


class NPOKL(NPO):
    retain_kl = True
