"""/v1/api-keys: mint, list and revoke keys (issue 12). The operator (an admin key of LETHE_ADMIN_TENANT)
manages every tenant's keys; an admin key of another tenant manages its own tenant's keys and cannot mint
admin keys. Every change names the key that made it in the audit log."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.service.api.auth import Principal, create_key, forget_cached, is_operator, require
from lethe.service.api.pagination import paginate
from lethe.service.api.schemas import ApiKeyCreate, ApiKeyOut, Page
from lethe.service.domain import audit_log
from lethe.service.domain.errors import Problem, not_found
from lethe.service.infra.db import INJECTED, transactional
from lethe.service.infra.tables import ApiKey, utcnow

router = APIRouter(prefix="/v1/api-keys", tags=["api keys"])


def key_out(key: ApiKey) -> dict:
    """An API key as the API shows it: never its secret, except once at creation."""
    return {"id": key.id, "tenant": key.tenant, "scopes": key.scopes, "name": key.name,
            "created_at": key.created_at, "revoked_at": key.revoked_at}


@router.post("", status_code=201, response_model=ApiKeyOut)
@transactional
def new_api_key(body: ApiKeyCreate, who: Principal = Depends(require("admin")), session: Session = INJECTED):
    """Mint a key for a tenant with scopes; the answer is the only time its secret is shown."""
    if not is_operator(who):
        if body.tenant != who.tenant:
            raise Problem(403, "forbidden", "Forbidden", "a tenant's admin key mints keys for its own tenant only")
        if {"admin", "metrics:read"} & set(body.scopes):  # both see past the tenant
            raise Problem(403, "forbidden", "Forbidden", "only the operator's admin key mints admin and "
                          "metrics:read keys")
    key, secret = create_key(session, body.tenant, list(body.scopes), name=body.name, by=who.key_id)
    session.commit()
    return {**key_out(key), "key": secret}


@router.get("", response_model=Page)
@transactional
def list_api_keys(who: Principal = Depends(require("admin")), session: Session = INJECTED,
                  tenant: str | None = Query(None, max_length=128), page_size: int = Query(50, ge=1, le=500),
                  page_token: str | None = None):
    """The caller's tenant's keys (the operator: every tenant's, or `tenant`'s); never their secrets."""
    query = select(ApiKey)
    if not is_operator(who):
        query = query.where(ApiKey.tenant == who.tenant)
    elif tenant is not None:
        query = query.where(ApiKey.tenant == tenant)
    rows, token = paginate(session, query, ApiKey, page_size, page_token)
    return {"items": [key_out(k) for k in rows], "next_page_token": token}


@router.delete("/{key_id}", response_model=ApiKeyOut)
@transactional
def revoke_api_key(key_id: str, who: Principal = Depends(require("admin")), session: Session = INJECTED):
    """Revoke a key: it stops working here at once and on every other API process within 5 s."""
    key = session.get(ApiKey, key_id)
    if key is None or (key.tenant != who.tenant and not is_operator(who)):
        raise not_found(f"API key {key_id!r}")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        audit_log.append(session, key.tenant, "key.revoked", key.id, {"by": who.key_id})
        session.commit()
    forget_cached(key.key_hash)
    return key_out(key)
