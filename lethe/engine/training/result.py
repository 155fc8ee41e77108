"""What a run hands back, typed: the result (JSON for the service and the CLI through `as_dict`), the merged
model and its tokenizer."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timing:
    """Where a run's seconds went."""
    wall_seconds: float
    load_seconds: float  # loading, encoding and (MASC) calibration: everything before the first step
    loop_seconds: float
    stop_check_seconds: float
    calibration_seconds: float | None = None  # MASC: the rule's targets measured on theta_0

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class RuleEvidence:
    """What MASC's online rule adds to a result: the calibrated targets and the per-record condition."""
    initial_violation_rate: float
    alpha: dict  # value and where it came from
    erasure: dict  # the condition, whether it was applied, ceilings, failing and reproduced ids
    neighbours: dict
    repair_steps: int
    escalations: list[dict]
    lora: dict
    secrets: dict
    retain_term: str
    own_text: dict | None = None  # the start model's samples the retain term kept (None: off or no retain records)


@dataclass
class BudgetEvidence:
    """What a fixed budget adds: its size, and the margin its final V was measured with (None: cancelled)."""
    budget_steps: int
    violation_yardstick: dict | None


@dataclass
class Measured:
    """What a stop policy measured once training ended."""
    final_violation_rate: float | None
    per_record: list[dict] | None  # None: cancelled before the measurement
    bound: dict | None  # Proposition 1, per record and in aggregate
    validation: dict
    counts: dict[str, int]
    v_trace: list[dict]
    evidence: RuleEvidence | BudgetEvidence


@dataclass
class UnlearnResult:
    """A run's result, typed; `as_dict` is the document the service stores and the CLI writes."""
    engine_version: str
    method: str
    model: str
    device: str
    stop_reason: str  # "alpha", "max_steps", "budget" or "cancelled"
    steps: int
    measured: Measured
    loss_trace: list[dict]
    seed: int
    params: dict
    versions: dict
    truncated: list[dict]
    timing: Timing
    peak_memory: dict = field(default_factory=dict)
    precision: dict = field(default_factory=dict)  # what was held in which dtype (lethe.engine.model.precision)
    format: str = "plain"  # how records were shown to the model: as they are, or in its chat template
    documents: list[dict] = field(default_factory=list)  # long documents split into windows, and their state
    anchor: str | None = None  # the retain term's fixed reference, where it was not the start model (issue 28)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> UnlearnResult:
        """The result back from the document `as_dict` wrote (a sharded run's rank 0 hands it over so); a key the
        document lacks raises, except those `as_dict` leaves out when empty."""
        kind: type[RuleEvidence] | type[BudgetEvidence] = \
            RuleEvidence if "initial_violation_rate" in doc else BudgetEvidence
        evidence = kind(**{f.name: doc[f.name] for f in dataclasses.fields(kind) if f.name in doc})
        measured = Measured(doc["final_violation_rate"], doc.get("per_record"), doc.get("bound"), doc["validation"],
                            doc["counts"], doc["v_trace"], evidence)
        return cls(engine_version=doc["engine_version"], method=doc["method"], model=doc["model"],
                   device=doc["device"], stop_reason=doc["stop_reason"], steps=doc["steps"], measured=measured,
                   loss_trace=doc["loss_trace"], seed=doc["seed"], params=doc["params"], versions=doc["versions"],
                   truncated=doc["truncated"], timing=Timing(**doc["timing"]), peak_memory=doc["peak_memory"],
                   precision=doc["precision"], format=doc["format"], documents=doc.get("documents", []),
                   anchor=doc.get("anchor"))

    @property
    def rule(self) -> RuleEvidence | None:
        """MASC's rule evidence; None for a fixed budget."""
        evidence = self.measured.evidence
        return evidence if isinstance(evidence, RuleEvidence) else None

    @property
    def alpha(self) -> float | None:
        """The alpha the rule used (calibrated or given); for a baseline its parameter, if it has one."""
        return self.rule.alpha["value"] if self.rule is not None else self.params.get("alpha")

    @property
    def final_violation_rate(self) -> float | None:
        return self.measured.final_violation_rate

    @property
    def wall_seconds(self) -> float:
        return self.timing.wall_seconds

    def as_dict(self) -> dict[str, Any]:
        """The result document (engine version 2's keys): what the service stores and the CLI writes."""
        m = self.measured
        out: dict[str, Any] = {
            "engine_version": self.engine_version, "method": self.method, "model": self.model, "device": self.device,
            "stop_reason": self.stop_reason, "steps": self.steps, "final_violation_rate": m.final_violation_rate,
            "format": self.format,
            **dataclasses.asdict(m.evidence),
            "v_trace": m.v_trace, "loss_trace": self.loss_trace, "validation": m.validation, "counts": m.counts,
            "truncated": self.truncated, "seed": self.seed, "params": self.params, "versions": self.versions,
        }
        if m.per_record is not None:
            out["per_record"] = m.per_record
        if m.bound is not None:
            out["bound"] = m.bound
        if self.documents:
            out["documents"] = self.documents
        if self.anchor is not None:
            out["anchor"] = self.anchor
        if out.get("violation_yardstick", ()) is None:
            del out["violation_yardstick"]
        return {**out, "timing": self.timing.as_dict(), "wall_seconds": self.timing.wall_seconds,
                "peak_memory": self.peak_memory, "precision": self.precision}


@dataclass
class UnlearnOutcome:
    """What run_unlearning hands back."""
    result: UnlearnResult
    model: object | None  # the merged transformers model; None when cancelled
    tokenizer: Any
