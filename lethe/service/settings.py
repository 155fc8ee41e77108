"""Settings from the environment (prefix LETHE_). The defaults are the embedded mode: SQLite, a
filesystem broker and artifacts under .lethe/, all on one machine with no Redis or PostgreSQL."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

HOME = Path(".lethe")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LETHE_", env_file=None)

    database_url: str = f"sqlite:///{HOME}/lethe.db"
    # "filesystem://" is kombu's broker in a folder (embedded mode); production: redis://host:6379/0.
    broker_url: str = "filesystem://"
    broker_dir: Path = HOME / "broker"
    # A local folder, or any fsspec URI (s3://bucket/prefix).
    artifact_root: str = str(HOME / "artifacts")
    # Local model sources must lie under one of these folders (so a client cannot read the server's disk).
    import_roots: list[str] = [str(HOME / "imports")]
    # s3:// model sources: only these buckets (none by default), read with the server's credentials.
    s3_buckets: list[str] = []
    # Granted to one tenant only, on top of the lists above (which every tenant may read): {"tenant": ["/srv/a"]}.
    # For tenants that must not read each other's sources, leave the lists above empty and grant here.
    tenant_import_roots: dict[str, list[str]] = {}
    tenant_s3_buckets: dict[str, list[str]] = {}

    def import_roots_of(self, tenant: str) -> list[str]:
        return [*self.import_roots, *self.tenant_import_roots.get(tenant, [])]

    def s3_buckets_of(self, tenant: str) -> list[str]:
        return [*self.s3_buckets, *self.tenant_s3_buckets.get(tenant, [])]
    # An S3-compatible endpoint (MinIO, R2, ...) for s3:// artifact roots and sources; None: AWS's own. Credentials
    # come from the usual AWS_* variables or files.
    s3_endpoint_url: str | None = None
    s3_part_bytes: int = 50 * 2**20  # a file larger than this is uploaded in parts of this size (S3's least: 5 MiB)
    max_source_bytes: int = 512 * 2**30  # a model source larger than this is refused before copying
    admin_key: str | None = None
    # Signs the audit log's checkpoints; never stored in the database. Unset: a key file made once beside
    # the embedded database (lethe.service.domain.audit_log). Production sets it from a secret store.
    audit_key: str | None = None
    audit_key_file: Path = HOME / "audit.key"
    admin_tenant: str = "default"
    max_body_bytes: int = 32 * 2**20
    max_records: int = 20_000
    max_attempts: int = 3
    # Coalescing (issue 28, lethe.service.domain.runs): at most this many queued requests of a model, and this many
    # forget records in all, join one run (1: every request runs alone).
    coalesce_max_requests: int = 16
    coalesce_max_records: int = 2_000
    # Per tenant, so that one cannot hold the only queue: jobs not yet ended, and the worker seconds its jobs
    # used over the last 24 hours (0: no limit).
    max_active_jobs: int = 20
    max_worker_seconds_per_day: float = 0.0
    lease_seconds: float = 60.0  # a job whose worker is silent this long is taken over
    heartbeat_seconds: float = 2.0
    sweep_seconds: float = 10.0  # how often QUEUED and orphaned jobs are re-sent to the queue
    # The most wall-clock seconds a job may take from its first start, over all its attempts (0: no limit). Past it
    # the worker stops the job at its next heartbeat and it ends FAILED (time-limit); a worker stuck past it by more
    # than TIME_LIMIT_GRACE is killed by Celery, and the job's next delivery ends it.
    max_job_seconds: float = 24 * 3600.0
    # How long a report keeps the answers quoted as examples (requested with audit.examples); then each is replaced by
    # its sha256 (lethe.service.domain.report_examples). 30 days.
    examples_retention_seconds: float = 30 * 86400.0
    visibility_timeout: int = 12 * 3600  # above the longest job (Redis redelivers unacked messages after it)
    device: str = "auto"
    queue: str = "gpu"
    # Memory planning (lethe.engine.contract.memory_plan): the bytes a worker's jobs may plan on (0: what its device
    # holds: a GPU's total memory, on CPU what the system has available). Workers announce it with their queue; the API
    # routes each job to the queue of the smallest device it fits, and refuses one that fits none.
    device_memory_bytes: int = 0
    device_refresh_seconds: float = 60.0  # how often a worker renews its announcement
    device_seen_seconds: float = 300.0  # an announcement older than this is ignored (its worker is gone)
    # Webhooks (lethe.service.domain.webhooks): targets on loopback, link-local or private networks are refused unless
    # the operator allows them; a delivery is retried with exponential backoff, then dead-lettered.
    webhook_allow_private: bool = False
    max_webhook_endpoints: int = 10  # per tenant, not deleted: each is a POST per event for the workers to make
    webhook_max_attempts: int = 10
    webhook_backoff_seconds: float = 5.0  # the first retry's delay; each next one doubles, up to an hour
    webhook_timeout_seconds: float = 10.0
    webhook_poll_seconds: float = 1.0  # how often a worker's dispatcher looks for deliveries due
    webhook_rotation_grace_seconds: float = 24 * 3600.0  # an old secret still signs this long after a rotation


@lru_cache
def get_settings() -> Settings:
    return Settings()
