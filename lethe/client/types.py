"""What the client gets back, typed: the service's models, versions and jobs as the API shows them. Each is checked
against the service's OpenAPI schema (tests/client/test_client.py); fields a newer server adds are ignored."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


class Typed(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Model(Typed):
    id: str
    name: str
    source: str
    format: str
    description: str | None
    retain_count: int
    latest_version: int | None
    created_at: datetime
    retire_predecessors: bool = False
    utility_count: int = 0
    anchor_version: int = 1


class Version(Typed):
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
    retired_at: datetime | None = None
    purged_at: datetime | None = None


class Progress(Typed):
    step: int | None = None
    max_steps: int | None = None
    violation_rate: float | None = None
    alpha: float | None = None
    losses: dict[str, float] | None = None
    heartbeat_at: datetime | None = None


class JobResult(Typed):
    model_version: int | None = None
    stop_reason: str | None = None
    steps: int | None = None
    wall_seconds: float | None = None
    connectivity: list[str] | None = None
    ensemble_version: int | None = None
    retired_versions: list[int] | None = None
    retain_records_pruned: int | None = None
    run_id: str | None = None


class Job(Typed):
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
    error: dict[str, Any] | None
    result: JobResult | None
    forget: dict[str, Any]
    run_id: str | None = None
    coalesce: bool = True

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL


class ManifestFile(Typed):
    path: str
    size: int
    sha256: str
