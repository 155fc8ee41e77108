"""The errors the service's domain raises, with no web framework: each is an RFC 9457 problem (a status, a
stable type and a detail). The API maps them to problem+json in one place (lethe.service.api.problems); the worker
writes `body()` into a failed job's error."""
from __future__ import annotations

from typing import Any

TYPE_BASE = "https://lethe.dev/problems/"


class Problem(Exception):
    def __init__(self, status: int, kind: str, title: str, detail: str | None = None, *,
                 headers: dict | None = None, **extra: Any):
        super().__init__(detail or title)
        self.status, self.kind, self.title, self.detail, self.extra = status, kind, title, detail, extra
        self.headers = headers or {}

    def body(self, instance: str | None = None) -> dict:
        body: dict[str, Any] = {"type": TYPE_BASE + self.kind, "title": self.title, "status": self.status}
        if self.detail:
            body["detail"] = self.detail
        if instance:
            body["instance"] = instance
        return {**body, **self.extra}


def not_found(what: str) -> Problem:
    return Problem(404, "not-found", "Not found", f"{what} does not exist")


def invalid(detail: str, field: str | None = None) -> Problem:
    extra: dict[str, Any] = {"errors": [{"field": field, "message": detail}]} if field else {}
    return Problem(422, "invalid-request", "Invalid request", detail, **extra)

