"""Unlearning methods: each module has one class with the same interface (see masc.Masc):
`__init__(params, policy, pad_id)` and `loss(forget_batch, retain_batch) -> (total, parts)`."""
from worker.engine.methods.ga import GradientAscent
from worker.engine.methods.graddiff import GradDiff
from worker.engine.methods.masc import Masc
from worker.engine.methods.npo import NPO, NPOKL
from worker.engine.methods.rmu import RMU
from worker.engine.methods.simnpo import SimNPO

METHODS = {m.name: m for m in (Masc, GradientAscent, GradDiff, NPO, NPOKL, SimNPO, RMU)}
