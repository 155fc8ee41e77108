"""Bearer API keys: stored as sha256 hashes, each with a tenant and scopes (SPEC section 8)."""
from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

import anyio
from fastapi import Depends, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.service.domain import audit_log
from lethe.service.domain.errors import Problem
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import ApiKey, AuditEntry, utcnow
from lethe.service.settings import get_settings

SCOPES = ("jobs:write", "jobs:read", "models:write", "artifacts:read", "metrics:read", "admin")


@dataclass(frozen=True)
class Principal:
    key_id: str
    tenant: str
    scopes: frozenset[str]


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return "lth_" + secrets.token_urlsafe(32)


def create_key(session: Session, tenant: str, scopes: list[str], name: str = "", secret: str | None = None,
               by: str | None = None):
    """Store a key (hashed); the secret is returned once and never kept. `by`: the key that minted it."""
    secret = secret or new_secret()
    key = ApiKey(tenant=tenant, name=name, key_hash=hash_key(secret), scopes=sorted(set(scopes)))
    session.add(key)
    session.flush()
    audit_log.append(session, tenant, "key.created", key.id, {"name": name, "scopes": key.scopes, "by": by})
    return key, secret


ADMIN_KEY_NAME = "admin (LETHE_ADMIN_KEY)"


def ensure_admin_key(session: Session, secret: str, tenant: str) -> None:
    """LETHE_ADMIN_KEY: the operator's key, created once. Rotating the variable revokes the key it held
    before: only the current one works."""
    digest = hash_key(secret)
    for old in session.scalars(select(ApiKey).where(ApiKey.name == ADMIN_KEY_NAME, ApiKey.key_hash != digest,
                                                    ApiKey.revoked_at.is_(None))):
        old.revoked_at = utcnow()
        audit_log.append(session, old.tenant, "key.revoked", old.id, {"by": ROTATED})
        forget_cached(old.key_hash)
    current = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
    if current is None:
        create_key(session, tenant, list(SCOPES), name=ADMIN_KEY_NAME, secret=secret, by="LETHE_ADMIN_KEY")
    elif current.revoked_at is not None and current.name == ADMIN_KEY_NAME and _revoked_by_rotation(session, current):
        # The operator rotated back to it. A key revoked through the API (leaked, say) stays revoked.
        current.revoked_at = None
        audit_log.append(session, current.tenant, "key.restored", current.id, {"by": "LETHE_ADMIN_KEY"})
        forget_cached(digest)


ROTATED = "LETHE_ADMIN_KEY rotated"


def _revoked_by_rotation(session: Session, key: ApiKey) -> bool:
    last = session.scalar(select(AuditEntry).where(AuditEntry.subject == key.id, AuditEntry.kind == "key.revoked")
                          .order_by(AuditEntry.seq.desc()).limit(1))
    return last is not None and (last.data or {}).get("by") == ROTATED


def is_operator(who: Principal) -> bool:
    """The operator: an admin key of LETHE_ADMIN_TENANT (other tenants' admins manage their own tenant)."""
    return "admin" in who.scopes and who.tenant == get_settings().admin_tenant


# Key hash -> (expiry, principal): saves a query per request; a revoked key stops working within KEY_CACHE_SECONDS.
# Unknown (or revoked) keys are cached apart, at most KEY_CACHE_LIMIT, the oldest dropped first: a flood of made-up
# keys costs one query each and never evicts a tenant's real key.
KEY_CACHE_SECONDS = 5.0
KEY_CACHE_LIMIT = 10_000
_key_cache: dict[str, tuple[float, Principal]] = {}
_unknown: OrderedDict[str, float] = OrderedDict()


def forget_cached(key_hash: str) -> None:
    """Drop a key from this process's cache (a revocation here takes effect at once)."""
    _key_cache.pop(key_hash, None)
    _unknown.pop(key_hash, None)


def cached(digest: str) -> tuple[bool, Principal | None]:
    """(whether this process knows the key's state, its principal or None)."""
    now = time.monotonic()
    hit = _key_cache.get(digest)
    if hit is not None and hit[0] > now:
        return True, hit[1]
    expiry = _unknown.get(digest)
    return (True, None) if expiry is not None and expiry > now else (False, None)


def lookup(secret: str) -> Principal | None:
    digest, now = hash_key(secret), time.monotonic()
    known, found = cached(digest)
    if known:
        return found
    with session_scope() as session:
        key = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
        found = None if key is None or key.revoked_at is not None else \
            Principal(key.id, key.tenant, frozenset(key.scopes))
    if found is None:
        _key_cache.pop(digest, None)
        _unknown[digest] = now + KEY_CACHE_SECONDS
        _unknown.move_to_end(digest)
        while len(_unknown) > KEY_CACHE_LIMIT:
            _unknown.popitem(last=False)
        return None
    if len(_key_cache) >= KEY_CACHE_LIMIT:  # real keys only; expired ones go first
        for stale in [d for d, (expiry, _) in _key_cache.items() if expiry <= now]:
            del _key_cache[stale]
    _key_cache[digest] = (now + KEY_CACHE_SECONDS, found)
    return found


async def principal(request: Request) -> Principal:
    # async, so that a cached key costs no hop through the thread pool
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "unauthenticated", "Unauthenticated", "send Authorization: Bearer <api key>")
    known, found = cached(hash_key(token.strip()))
    if not known:
        found = await anyio.to_thread.run_sync(lookup, token.strip())
    if found is None:
        raise Problem(401, "unauthenticated", "Unauthenticated", "unknown or revoked API key")
    return found


def require(scope: str):
    """Dependency: the caller's principal, which must hold `scope` (admin holds every scope)."""
    async def check(who: Principal = Depends(principal)) -> Principal:
        if scope not in who.scopes and "admin" not in who.scopes:
            raise Problem(403, "forbidden", "Forbidden", f"this key lacks the scope {scope!r}")
        return who
    return check
