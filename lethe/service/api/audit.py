"""/v1/audit-log (the tenant's entries, oldest first) and its verification; retrain references."""
from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from lethe.service.api.auth import Principal, require
from lethe.service.api.jobs import checked_records
from lethe.service.api.schemas import MAX_VERSION
from lethe.service.domain import audit_log, lineage, webhooks
from lethe.service.domain.errors import Problem, invalid
from lethe.service.domain.jobs import forget_evidence
from lethe.service.infra.db import INJECTED, transactional
from lethe.service.infra.tables import AuditEntry, RetrainReference
from lethe.service.settings import get_settings

router = APIRouter(tags=["audit"])


def entry_out(e: AuditEntry) -> dict:
    """An audit-log entry as the API shows it. Entries written before issue 26 named the request's subjects by plain
    hash: shown without them (the chain is verified on the stored entry, which keeps them)."""
    data = {k: v for k, v in e.data.items() if k != webhooks.PLAIN_SUBJECT_HASHES}
    return {"seq": e.seq, "at": e.at, "kind": e.kind, "subject": e.subject, "data": data,
            "prev_hash": e.prev_hash, "hash": e.hash}


@router.get("/v1/audit-log")
@transactional
def list_entries(who: Principal = Depends(require("jobs:read")), session: Session = INJECTED,
                 page_size: int = Query(100, ge=1, le=1000), page_token: str | None = None):
    """The tenant's audit-log entries in order, paginated."""
    after = 0
    if page_token is not None:
        if not re.fullmatch(r"[0-9]{1,18}", page_token):  # a sequence number, within a 64-bit integer
            raise invalid("page_token is not a token this service issued", "page_token")
        after = int(page_token)
    rows = session.scalars(select(AuditEntry).where(AuditEntry.tenant == who.tenant, AuditEntry.seq > after)
                           .order_by(AuditEntry.seq).limit(page_size + 1)).all()
    more = len(rows) > page_size
    rows = rows[:page_size]
    return {"items": [entry_out(e) for e in rows], "next_page_token": str(rows[-1].seq) if more and rows else None}


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=0, le=2**62)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    signature: str = Field(pattern=r"^[0-9a-f]{64}$")


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoints: list[Checkpoint] = Field(default_factory=list, max_length=1000)
    full: bool = False  # walk from the first entry (admin keys only)


@router.get("/v1/audit-log/verify")
@transactional
def verify(who: Principal = Depends(require("jobs:read")), session: Session = INJECTED,
           full: bool = Query(False, description="walk from the first entry (admin keys only), not from the point "
                                                 "the last verification reached")):
    """Walk the chain on from where the last verification found it whole (`from_seq`; a signed record of it), or
    whole with `full`; the caller's entries counted, and a signed checkpoint of the head to keep."""
    key = audit_log.signing_key(get_settings())
    return {**audit_log.verify(session, key, tenant=who.tenant, full=_full(who, full)),
            "checkpoint": audit_log.checkpoint(session, key)}


def _full(who: Principal, full: bool) -> bool:
    """A whole walk reads every entry: an admin's to ask for (a reader's key could otherwise load the database at
    will)."""
    if full and "admin" not in who.scopes:
        raise Problem(403, "forbidden", "Forbidden", "full=true walks the whole chain: an admin key's call")
    return full


@router.post("/v1/audit-log/verify")
@transactional
def verify_against(body: VerifyRequest, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """As GET, and every checkpoint the caller kept (from reports or earlier calls) must still hold: our
    signature, and its entry present with that hash. A chain cut back or rewritten whole fails here."""
    key = audit_log.signing_key(get_settings())
    result = audit_log.verify(session, key, [c.model_dump() for c in body.checkpoints], tenant=who.tenant,
                              full=_full(who, body.full))
    return {**result, "checkpoint": audit_log.checkpoint(session, key)}


@router.get("/v1/audit-log/checkpoint")
@transactional
def checkpoint(who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """The chain's head, signed with LETHE_AUDIT_KEY: keep it to detect later truncation or rewriting."""
    return audit_log.checkpoint(session, audit_log.signing_key(get_settings()))


class ReferenceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1, le=MAX_VERSION)
    forget: list[dict] | None = None
    forget_manifest_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


@router.post("/v1/models/{model_id}/references", status_code=201)
@transactional
def mark_reference(model_id: str, body: ReferenceCreate, who: Principal = Depends(require("models:write")),
                   session: Session = INJECTED):
    """Mark a version as the retrain reference for a forget set, named by its records or their manifest hash."""
    model = lineage.get_model(session, who.tenant, model_id)
    version = lineage.get_version(session, model, body.version)
    if (body.forget is None) == (body.forget_manifest_sha256 is None):
        raise invalid("give the forget records or their forget_manifest_sha256, not both", "forget")
    records = checked_records(body.forget, "forget", get_settings().max_records) if body.forget is not None else []
    digest = body.forget_manifest_sha256 or forget_evidence(records or [])["manifest_sha256"]
    reference = RetrainReference(model_id=model.id, version_number=version.number, forget_manifest_sha256=digest)
    session.add(reference)
    try:
        session.flush()
    except IntegrityError:
        raise Problem(409, "conflict", "Conflict", "this forget set already has a retrain reference") from None
    audit_log.append(session, who.tenant, "reference.created", f"{model.id}/v{version.number}",
                     {"forget_manifest_sha256": digest})
    return {"model_id": model.id, "version": version.number, "forget_manifest_sha256": digest}
