"""Request and response bodies. Unknown fields are refused (extra="forbid")."""
from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lethe.engine.connectivity.params import ConnectivityParams
from lethe.engine.contract.chat_format import FORMATS
from lethe.engine.contract.parameters import Rule, help_of, json_schema, rule_of
from lethe.engine.methods import METHODS, all_presets
from lethe.service.domain.webhooks import EVENTS

MAX_VERSION = 999_999_999  # version numbers fit any database's integer
PLAIN = r"^[^\x00-\x1f\x7f-\x9f]*$"  # no control characters: a NUL reached PostgreSQL as a server error
PROSE = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"  # the same, with tabs and line breaks
Record = dict[str, Any]  # checked by lethe.engine.contract.record_checks with the engine's own rules


# Read from the registry when the schema is generated, so a method registered later is listed too.
def _method_params_schema(schema: dict) -> None:
    schema["anyOf"] = [m.schema() for m in METHODS.values()] + [{"type": "null"}]


def _method_names(schema: dict) -> None:
    schema["enum"] = list(METHODS)
    schema["description"] = "; ".join(f"{m.name}: {m.summary}" for m in METHODS.values())


def _preset_names(schema: dict) -> None:
    schema["enum"] = [*all_presets(), None]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCreate(Strict):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    # No control characters: a NUL in a path reaches the filesystem as an error, not as a 422.
    source: str = Field(min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f\x7f]+$",
                        description="local path | hf:org/name | s3://...")
    retain: list[Record] | None = None
    utility: list[Record] | None = Field(default=None, description=(
        "records the model should keep answering that no erasure trains on (unlike retain): every erasure's audit "
        "measures model utility on them before and after (utility_set), the damage no retain term prevents"))
    description: str | None = Field(default=None, max_length=10_000, pattern=PROSE)
    format: str = Field(default="plain", max_length=16, json_schema_extra={"enum": list(FORMATS)}, description=(
        "how its jobs show records to the model unless a job says otherwise: \"plain\" (prompt + completion as "
        "one string) or \"chat\" (its tokenizer's chat template, user and assistant turns)"))
    retire_predecessors: bool = Field(default=False, description=(
        "once an erasure succeeds, retire every served version that lacks an erasure done on the model (their "
        "downloads answer 410 Gone)"))


class ModelUpdate(Strict):
    retire_predecessors: bool | None = Field(default=None, description="see ModelCreate.retire_predecessors")
    anchor_version: int | None = Field(default=None, ge=1, le=MAX_VERSION, description=(
        "the version every erasure's retain term keeps the model close to on the retain records, fixed over the "
        "lineage so that drift does not compound request after request; null: the root (version 1, the default)"))
    utility: list[Record] | None = Field(default=None, description="the utility set in place of the one stored "
                                         "(see ModelCreate.utility; [] removes it)")


class ModelOut(BaseModel):
    id: str
    name: str
    source: str
    format: str
    description: str | None
    retain_count: int
    utility_count: int  # records in its utility set (ModelCreate.utility)
    retire_predecessors: bool
    anchor_version: int  # the retain term's fixed reference (1: the root)
    latest_version: int | None
    created_at: datetime


class VersionOut(BaseModel):
    model_id: str
    number: int
    parent: int | None
    job_id: str | None
    state: str
    manifest_sha256: str
    files: int
    size_bytes: int
    erased_request_ids: list[str]
    tags: list[str]
    created_at: datetime
    retired_at: datetime | None = None  # no longer served (downloads 410)
    purged_at: datetime | None = None  # files deleted, manifest kept


class AuditOptions(Strict):
    quantization: bool = True
    relearn: bool = True
    examples: bool = False  # quote generated forget text in the report
    secret_samples: int = Field(default=10, ge=0, le=100, description=(
        "Seeded samples at temperature 1 per forget prompt for the secret-extraction audit (0: no sampling)."))
    secret_greedy_max: float = Field(default=0.0, ge=0, le=1, description=(
        "Verdict relaxation: on each greedy channel (the prompt, the paraphrased prompt, the 4-bit copy, after "
        "relearning) the largest share of forget records that may give a secret back or reproduce the record beyond "
        "its floor, for the verdict 'Forgotten' (default 0: none)."))
    secret_sampled_max: float = Field(default=0.0, ge=0, le=1, description=(
        "Verdict relaxation: per forget record, the rate above its floor (the retrain reference's own rate, else the "
        "retain answers' rate) at which its samples may say a secret; a record leaks when more of its samples do "
        "than a model at that rate would give with probability 0.99 (default 0: at a floor of 0, none)."))


def _the_parent() -> list[Literal["parent"] | int]:
    return ["parent"]


def curve_field(name: str) -> Any:
    """A connectivity option with the engine's own default, help and range (shown in the schema, checked once, by
    the engine, when the job specification is parsed)."""
    spec = next(f for f in dataclasses.fields(ConnectivityParams) if f.name == name)
    rule = rule_of(spec) or Rule()
    extra: dict[str, Any] = {k: v for k, v in (("minimum", rule.ge), ("exclusiveMinimum", rule.gt),
                                               ("maximum", rule.le), ("exclusiveMaximum", rule.lt)) if v is not None}
    if rule.choices is not None:
        extra["enum"] = list(rule.choices)
    return Field(default=spec.default, description=help_of(spec), json_schema_extra=extra or None)


def _curve_params_schema(schema: dict) -> None:
    schema["anyOf"] = [json_schema(ConnectivityParams, title="connectivity parameters"), {"type": "null"}]


class CurveOptions(Strict):
    """The options of a connectivity curve: the common ones by name, the others under `params`."""
    curve: str = curve_field("curve")
    points: int = curve_field("points")
    ensemble: bool = curve_field("ensemble")
    tolerance: float = curve_field("tolerance")
    params: dict[str, Any] | None = Field(default=None, json_schema_extra=_curve_params_schema, description=(
        "further connectivity parameters (fit_steps, space, ensemble_points, ...)"))

    def engine_values(self) -> dict:
        """The flat connectivity parameters these options stand for."""
        return {**(self.params or {}), "curve": self.curve, "points": self.points, "ensemble": self.ensemble,
                "tolerance": self.tolerance}

    @staticmethod
    def body_field(name: str) -> str:
        """Where a connectivity parameter sits in these options."""
        return name if name in ("curve", "points", "ensemble", "tolerance") else f"params.{name}"


class McuRequest(CurveOptions):
    """Mode connectivity as part of an unlearning job (SPEC section 6); the curves use the job's margin."""
    against: list[Literal["parent"] | Annotated[int, Field(ge=1, le=MAX_VERSION)]] = Field(
        default_factory=_the_parent, min_length=1, max_length=5)


class ConnectivityCreate(CurveOptions):
    """A connectivity job on its own: the curve between versions a and b of a model."""
    a: int = Field(ge=1, le=MAX_VERSION)
    b: int = Field(ge=1, le=MAX_VERSION)
    forget: list[Record] | None = None


class ConnectivityOut(BaseModel):
    id: str
    model_id: str
    job_id: str
    a: int
    b: int
    curve: str
    mcu_holds: bool | None
    barriers: dict
    points: list
    suppress_first: dict | None
    ensemble: dict | None
    details: dict
    created_at: datetime


class JobCreate(Strict):
    model_id: str
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION)
    request_id: str = Field(min_length=1, max_length=256, pattern=PLAIN)
    forget: list[Record] = Field(min_length=1)
    retain: list[Record] | None = None
    holdout: list[Record] | None = None
    method: str = Field(default="masc", max_length=64, pattern=PLAIN, json_schema_extra=_method_names)
    preset: str | None = Field(default=None, max_length=64, pattern=PLAIN, json_schema_extra=_preset_names,
                               description="MASC's published or named values, under explicit params")
    params: dict[str, Any] | None = Field(default=None, json_schema_extra=_method_params_schema, description=(
        "The method's parameters, checked with the engine's own rules; none are needed (the schemas below give "
        "each method's names, ranges, defaults and meaning)."))
    format: str | None = Field(default=None, max_length=16, json_schema_extra={"enum": [*FORMATS, None]}, description=(
        "\"plain\" or \"chat\" (the tokenizer's chat template: user and assistant turns, the answer scored); "
        "default: the model's"))
    subjects: list[Annotated[str, Field(min_length=1, max_length=256, pattern=PLAIN)]] | None = Field(
        default=None, max_length=1000, description=(
            "The data subjects the request concerns, as opaque ids (kept only as hashes): "
            "GET /v1/subjects/{subject} then answers what was erased of each, where and when."))
    audit: AuditOptions | None = None
    mcu: McuRequest | None = None
    coalesce: bool = Field(default=True, description=(
        "Whether the request may join one run with the model's other queued requests that run the same way "
        "(same method, parameters, audit options; no curves): one run, one audit, one new version for all, each "
        "request keeping its own job, result slice, verdict and report. false: it runs alone."))


class Progress(BaseModel):
    step: int | None = None
    max_steps: int | None = None
    violation_rate: float | None = None
    alpha: float | None = None  # the V the stop rule stops at (None for a fixed budget)
    losses: dict[str, float] | None = None
    heartbeat_at: datetime | None = None


class JobResult(BaseModel):
    model_version: int | None = None
    stop_reason: str | None = None
    steps: int | None = None
    wall_seconds: float | None = None
    connectivity: list[str] | None = None  # ids of the curves measured (GET /v1/models/{id}/connectivity/{cid})
    ensemble_version: int | None = None
    retired_versions: list[int] | None = None  # versions retired by the model's retire_predecessors setting
    retain_records_pruned: int | None = None  # records of the model's retain set this erasure removed from it
    run_id: str | None = None  # the coalesced run it was part of (its leading job's id); None: it ran alone


class JobOut(BaseModel):
    id: str
    kind: str
    state: str
    request_id: str
    model_id: str
    base_version: int
    method: str
    progress: Progress
    attempt: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    error: dict | None
    result: JobResult | None
    forget: dict  # evidence only: count and hashes, never the records
    run_id: str | None = None  # the coalesced run it is or was part of (its leading job's id); None: alone
    coalesce: bool = True  # whether it may join a coalesced run


class SubjectRequest(BaseModel):
    request_id: str
    job_id: str
    model_id: str
    state: str
    created_at: datetime
    ended_at: datetime | None
    version: int | None  # the version the request made (SUCCEEDED only)
    verdict: dict | None  # the report's verdict: forgotten and its summary


class SubjectModel(BaseModel):
    model_id: str
    name: str
    erased: bool  # some request naming the subject succeeded on this model
    erased_in: list[dict]  # request id and the version it made
    versions_holding_erasure: list[int]
    versions_predating_erasure: list[int]  # served versions without every such erasure: stop serving these
    versions_predating_retired: list[int] = []  # predating versions retired (files kept, not served)
    versions_predating_purged: list[int] = []  # predating versions purged (files deleted)
    pending_requests: list[str]


class SubjectLookup(Strict):
    subject: str = Field(min_length=1, max_length=256, pattern=PLAIN)


class SubjectOut(BaseModel):
    subject: str
    requests: list[SubjectRequest]
    models: list[SubjectModel]


class WebhookCreate(Strict):
    url: str = Field(min_length=1, max_length=2048, pattern=r"^[^\x00-\x20\x7f]+$",
                     description="where deliveries are POSTed: http(s), a public address unless the operator allows "
                                 "private ones")
    events: list[str] = Field(default_factory=lambda: ["*"], min_length=1, max_length=50, json_schema_extra={
        "items": {"enum": ["*", "job.*", *EVENTS]}}, description="event types, a prefix such as job.*, or *")
    description: str = Field(default="", max_length=1000, pattern=PROSE)


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    description: str
    created_at: datetime
    disabled_at: datetime | None
    previous_secret_valid_until: datetime | None
    secret: str | None = None  # in the answers that create or rotate it only


class DeliveryOut(BaseModel):
    id: str  # the webhook-id header: each delivery once, also when redelivered
    endpoint_id: str
    event: str
    state: str  # PENDING, DELIVERED, DEAD (the dead letter)
    attempts: int
    next_attempt_at: datetime | None
    created_at: datetime
    delivered_at: datetime | None
    log: list[dict]
    payload: dict


class Page(BaseModel):
    items: list
    next_page_token: str | None


class ApiKeyCreate(Strict):
    tenant: str = Field(min_length=1, max_length=128, pattern=PLAIN)
    scopes: list[Literal["jobs:write", "jobs:read", "models:write", "artifacts:read", "metrics:read", "admin"]] = \
        Field(min_length=1)
    name: str = Field(default="", max_length=256, pattern=PLAIN)


class ApiKeyOut(BaseModel):
    id: str
    tenant: str
    scopes: list[str]
    name: str
    created_at: datetime
    revoked_at: datetime | None = None
    key: str | None = None  # the secret, in the creation answer only
