"""Database tables: API keys, models and their versions, jobs (unlearning and connectivity), the data subjects
they name, idempotency records, retrain references, the audit log, connectivity results."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JOB_STATES = ("QUEUED", "RUNNING", "CANCELLING", "SUCCEEDED", "FAILED", "CANCELLED")
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every database (SQLite hands back naive ones otherwise)."""
    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(timezone.utc) if value is not None else None

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    pass


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key"))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the secret
    scopes: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Model(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("tenant", "name"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("mdl"))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[str] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    retain_records: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # Records no run trains on, measured before and after each erasure: its collateral damage (issue 28).
    utility_records: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # How its jobs show records to it by default: "plain" or "chat" (its tokenizer's template; issue 14).
    format: Mapped[str] = mapped_column(String(16), default="plain", server_default="plain")
    # Once an erasure succeeds, retire every served version that lacks an erasure (issue 26).
    retire_predecessors: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The version every erasure's retain term keeps the model close to (issue 28): fixed over the lineage, so that
    # drift does not compound request after request. None: the root (version 1).
    anchor_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "number"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ver"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    parent_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # One version per job at most: a retried or duplicated job cannot create a second one.
    job_id: Mapped[str | None] = mapped_column(String(40), unique=True, nullable=True)
    # READY (served), RETIRED (files kept, not served), PURGED (files deleted, manifest kept): issue 26.
    state: Mapped[str] = mapped_column(String(16), default="READY")
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    purged_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    location: Mapped[str] = mapped_column(Text)  # the artifact store prefix
    manifest: Mapped[list] = mapped_column(JSON)  # [{"path", "size", "sha256"}]
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    # Its parameter count from its safetensors headers, read once (-1: it has none); None: not read yet.
    parameters: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    erased_request_ids: Mapped[list] = mapped_column(JSON, default=list)
    tags: Mapped[list] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job"))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(16), default="unlearning", server_default="unlearning")
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), index=True)
    base_version: Mapped[int] = mapped_column(Integer)  # the head at submission; at start, where follows_head
    # The request named no version: the job starts from the head as it is when the job starts (the erasures
    # of jobs that finished meanwhile included), and base_version is set then.
    follows_head: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    request_id: Mapped[str] = mapped_column(String(256))
    method: Mapped[str] = mapped_column(String(32))
    preset: Mapped[str | None] = mapped_column(String(64), nullable=True)
    params: Mapped[dict] = mapped_column(JSON)  # as requested (evidence); the job runs `spec`
    # What the job runs, checked once at submission (lethe.engine.job_spec.JobSpec.stored): the method's
    # parameters with defaults and preset resolved, and the curves' parameters. The worker trusts it.
    spec: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True, default="QUEUED")
    # The data being erased: kept only until the job is terminal (SPEC section 9).
    forget_records: Mapped[list | None] = mapped_column(JSON, nullable=True)
    forget_evidence: Mapped[dict] = mapped_column(JSON)  # count, per-record sha256, manifest sha256
    retain_records: Mapped[list | None] = mapped_column(JSON, nullable=True)
    holdout_records: Mapped[list | None] = mapped_column(JSON, nullable=True)
    progress: Mapped[dict] = mapped_column(JSON, default=dict)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(256), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The broker queue the job was routed to (lethe.service.domain.capacity); None: the service's default queue.
    queue: Mapped[str | None] = mapped_column(String(128), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # Coalescing (issue 28): whether the request may join a run with other queued requests of its model, and the run
    # it was part of (the leading job's id; None: it ran alone).
    coalesce: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    run_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    audit_options: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # Mode connectivity: {"against": [version numbers], "curve", "points", "ensemble", ...} (SPEC section 6).
    mcu_options: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    report: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # the audit evidence (SPEC section 5)
    # When the report's quoted examples are replaced by their hashes (None: it quotes none, or no longer).
    examples_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True, index=True)
    error: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # a problem object
    result: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # summary for the job view
    engine_result: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # the engine's result JSON


class ErasureSubject(Base):
    """A data subject a deletion request named (issue 14), kept as the sha256 of the tenant and the subject's
    opaque id, never the id itself: the service answers for a subject it is asked about and lists none."""
    __tablename__ = "erasure_subjects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128))
    subject_hmac: Mapped[str] = mapped_column(String(64))  # lethe.service.domain.subjects.subject_hmac
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    __table_args__ = (Index("ix_erasure_subjects_tenant_subject", "tenant", "subject_hmac"),)


class WorkerDevice(Base):
    """A worker process's device as it announces it (lethe.worker.devices): its queue, the memory a job may plan on and
    what dtype "auto" means there. The API routes and refuses jobs by these rows; a worker that stops deletes its
    own, and one not seen for LETHE_DEVICE_SEEN_SECONDS is ignored."""
    __tablename__ = "worker_devices"
    id: Mapped[str] = mapped_column(String(256), primary_key=True)  # host:pid of the worker process
    queue: Mapped[str] = mapped_column(String(128), index=True)
    device: Mapped[str] = mapped_column(String(64))
    capacity_bytes: Mapped[int] = mapped_column(BigInteger)
    auto_dtype: Mapped[str] = mapped_column(String(16))
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookEndpoint(Base):
    """Where a tenant wants its events POSTed, signed in the Standard Webhooks format (issue 14). The secret signs;
    after a rotation the previous one signs too until `previous_until`, so receivers can switch without a gap."""
    __tablename__ = "webhook_endpoints"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("whk"))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list] = mapped_column(JSON)  # event types, "job.*" prefixes or "*"
    description: Mapped[str] = mapped_column(Text, default="")
    secret: Mapped[str] = mapped_column(String(128))
    previous_secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    previous_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class WebhookDelivery(Base):
    """One event for one endpoint: the outbox row, written in the transaction of the change it reports, and its
    delivery log. Its id is the webhook-id receivers deduplicate on; a redelivery keeps it."""
    __tablename__ = "webhook_deliveries"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("msg"))
    tenant: Mapped[str] = mapped_column(String(128))
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id"), index=True)
    event: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="PENDING")  # PENDING, DELIVERED, DEAD
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # since it was last (re)queued
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # A dispatcher's claim while it POSTs: its token, and when the claim lapses (a dead dispatcher's row is retried).
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    log: Mapped[list] = mapped_column(JSON, default=list)  # every attempt: when, status or error, milliseconds
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),)


class IdempotencyRecord(Base):
    __tablename__ = "idempotency_records"
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(256))
    body_sha256: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict] = mapped_column(JSON)
    location: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RetrainReference(Base):
    """A version marked as the retrain reference (gold standard) for one forget set of a model."""
    __tablename__ = "retrain_references"
    __table_args__ = (UniqueConstraint("model_id", "forget_manifest_sha256"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ref"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), index=True)
    version_number: Mapped[int] = mapped_column(Integer)
    forget_manifest_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AuditEntry(Base):
    """Append-only and hash-chained (SPEC section 9): hash = sha256(prev_hash + the entry's content)."""
    __tablename__ = "audit_log"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(128))
    data: Mapped[dict] = mapped_column(JSON)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)


class AuditVerification(Base):
    """How far the chain was last walked and found whole (issue 26): the entry's seq and hash, signed with the audit
    key, so a verification walks on from there instead of from the start. A row whose signature does not check is
    ignored (the walk starts over)."""
    __tablename__ = "audit_verifications"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    seq: Mapped[int] = mapped_column(Integer, index=True)
    hash: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Connectivity(Base):
    """One curve between two versions of a model: its points, barriers and analysis (SPEC section 6)."""
    __tablename__ = "connectivity"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("mcu"))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), index=True)
    job_id: Mapped[str] = mapped_column(String(40), index=True)
    version_a: Mapped[int] = mapped_column(Integer)
    version_b: Mapped[int] = mapped_column(Integer)
    curve: Mapped[str] = mapped_column(String(16))
    mcu_holds: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    barriers: Mapped[dict] = mapped_column(JSON)
    points: Mapped[list] = mapped_column(JSON)
    suppress_first: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    ensemble: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # version number and its evaluation
    details: Mapped[dict] = mapped_column(JSON)  # space, fit trace, counts, timing, parameters
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
