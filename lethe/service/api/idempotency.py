"""Idempotency-Key (SPEC section 8): the same key and body replay the first answer; the same key with
another body is 422. The record is written in the transaction that creates the resource."""
from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from lethe.service.api.auth import Principal
from lethe.service.domain.digests import canonical_sha256
from lethe.service.domain.errors import Problem
from lethe.service.infra.tables import IdempotencyRecord


def idempotent(session: Session, who: Principal, request: Request, key: str | None, body: dict,
               create: Callable[[], tuple[int, dict, str | None]],
               after_commit: Callable[[dict], None] | None = None) -> JSONResponse:
    """Run `create` once per (tenant, key) and commit; it returns (status, body, location).
    `after_commit` runs once the resource is durable (enqueueing a job, say)."""
    endpoint = f"{request.method} {request.url.path}"
    digest = canonical_sha256(body)
    if key is not None:
        if not 1 <= len(key) <= 256:
            raise Problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", "use 1 to 256 characters")
        previous = session.get(IdempotencyRecord, (who.tenant, key))
        if previous is not None:
            return _replay(previous, endpoint, digest)
    try:
        status, payload, location = create()
        payload = jsonable_encoder(payload)
        if key is not None:
            session.add(IdempotencyRecord(tenant=who.tenant, key=key, endpoint=endpoint, body_sha256=digest,
                                          status_code=status, response=payload, location=location))
        session.commit()
    except IntegrityError:  # a concurrent twin (same key, or the same unique name) committed first
        session.rollback()
        previous = session.get(IdempotencyRecord, (who.tenant, key)) if key is not None else None
        if previous is None:
            raise Problem(409, "conflict", "Conflict", "the resource conflicts with an existing one") from None
        return _replay(previous, endpoint, digest)
    if after_commit is not None:
        after_commit(payload)
    return _answer(status, payload, location)


def _replay(previous: IdempotencyRecord, endpoint: str, digest: str) -> JSONResponse:
    if previous.endpoint != endpoint or previous.body_sha256 != digest:
        raise Problem(422, "idempotency-key-reused", "Idempotency-Key reused",
                      "this Idempotency-Key was used with another request body")
    return _answer(previous.status_code, previous.response, previous.location, replayed=True)


def _answer(status: int, payload: dict, location: str | None, replayed: bool = False) -> JSONResponse:
    headers = {"Location": location} if location else {}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(payload, status_code=status, headers=headers)
