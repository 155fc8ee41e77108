"""Bearer API keys: stored as sha256 hashes, each with a tenant and scopes (SPEC section 8)."""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from fastapi import Depends, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db import get_session
from service.models import ApiKey
from service.problems import Problem

SCOPES = ("jobs:write", "jobs:read", "models:write", "artifacts:read", "admin")


@dataclass(frozen=True)
class Principal:
    key_id: str
    tenant: str
    scopes: frozenset[str]


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return "lth_" + secrets.token_urlsafe(32)


def create_key(session: Session, tenant: str, scopes: list[str], name: str = "", secret: str | None = None):
    """Store a key (hashed); the secret is returned once and never kept."""
    secret = secret or new_secret()
    key = ApiKey(tenant=tenant, name=name, key_hash=hash_key(secret), scopes=sorted(set(scopes)))
    session.add(key)
    session.flush()
    return key, secret


def ensure_admin_key(session: Session, secret: str, tenant: str) -> None:
    """LETHE_ADMIN_KEY: the first admin key, created once."""
    if session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret))) is None:
        create_key(session, tenant, list(SCOPES), name="admin (LETHE_ADMIN_KEY)", secret=secret)


def principal(request: Request, session: Session = Depends(get_session)) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "unauthenticated", "Unauthenticated", "send Authorization: Bearer <api key>")
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(token.strip())))
    if key is None or key.revoked_at is not None:
        raise Problem(401, "unauthenticated", "Unauthenticated", "unknown or revoked API key")
    return Principal(key.id, key.tenant, frozenset(key.scopes))


def require(scope: str):
    """Dependency: the caller's principal, which must hold `scope` (admin holds every scope)."""
    def check(who: Principal = Depends(principal)) -> Principal:
        if scope not in who.scopes and "admin" not in who.scopes:
            raise Problem(403, "forbidden", "Forbidden", f"this key lacks the scope {scope!r}")
        return who
    return check
