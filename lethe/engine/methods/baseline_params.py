"""Parameters of the fixed-budget baselines (SPEC section 4). One class serves them all; each method's published
defaults come with its registration (lethe.engine.methods)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lethe.engine.contract.parameters import SharedParams, param
from lethe.engine.methods.masc.params import MascParams


@dataclass
class BaselineParams(SharedParams):
    # Objective weights: GradDiff's gamma is forget_weight and alpha retain_weight; RMU's alpha is retain_weight.
    forget_weight: float = param(1.0, "weight of the forget term (GradDiff's gamma, SimNPO's forget weight)", gt=0)
    retain_weight: float = param(1.0, "weight of the retain term (GradDiff's and RMU's alpha)", ge=0)
    beta: float = param(0.1, "NPO / SimNPO inverse temperature", gt=0)
    delta: float = param(0.0, "SimNPO margin")
    rmu_layer: int = param(-1, "RMU: the layer whose hidden states are steered",
                           note="-1: about a quarter of the depth")
    rmu_c: float = param(20.0, "RMU: length of the random control vector c * u", gt=0)
    # The field's default budget: 10 epochs, AdamW, weight decay 0.01, linear schedule, one warm-up epoch,
    # effective batch 32 (micro-batches of batch_size accumulated).
    epochs: float = param(10.0, "the budget: passes over the forget set", gt=0, le=10_000)
    lr: float = param(0.0, "AdamW peak learning rate", ge=0, le=1, note="0: 1e-4 with LoRA, 1e-5 full")
    weight_decay: float = param(0.01, "AdamW weight decay", ge=0)
    warmup_epochs: float = param(1.0, "linear warm-up, in epochs, before the linear decay", ge=0)
    effective_batch: int = param(32, "forget records per optimiser step: micro-batches of batch_size are "
                                     "accumulated up to it", ge=1, le=1_000_000)

    def margin(self) -> dict[str, float]:
        """The yardstick every baseline's V is measured with: MASC's default margin."""
        return MascParams().margin()

    def resolved(self) -> BaselineParams:
        """lr 0: the field's default for the parameter space, 1e-4 with LoRA, 1e-5 in full."""
        return dataclasses.replace(self, lr=self.lr or (1e-4 if self.adapters else 1e-5))

    def check(self) -> None:
        super().check()
        self.need(self.effective_batch >= self.batch_size, "effective_batch", "must be >= batch_size")
