"""The audit log (SPEC section 9): append-only and hash-chained. Each entry's hash covers the previous
entry's hash and its own content, so an edited, inserted or deleted row breaks the chain at that point,
and `verify` names the first broken link."""
from __future__ import annotations

import hashlib
import json

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.models import AuditEntry, utcnow

GENESIS = "0" * 64


def entry_hash(prev_hash: str, at: str, tenant: str, kind: str, subject: str, data: dict) -> str:
    content = json.dumps({"at": at, "tenant": tenant, "kind": kind, "subject": subject, "data": data},
                         sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256((prev_hash + content).encode()).hexdigest()


def _stamp(entry: AuditEntry) -> str:
    return entry.at.isoformat(timespec="microseconds")


def append(session: Session, tenant: str, kind: str, subject: str, data: dict | None = None) -> AuditEntry:
    """Add an entry in the caller's transaction; appends are serialised so the chain stays linear."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(7310001)"))  # released at commit
    last = session.scalar(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1))
    prev = last.hash if last else GENESIS
    data = json.loads(json.dumps(data or {}, default=str))
    entry = AuditEntry(at=utcnow(), tenant=tenant, kind=kind,
                       subject=subject, data=data, prev_hash=prev)
    entry.hash = entry_hash(prev, _stamp(entry), tenant, kind, subject, data)
    session.add(entry)
    session.flush()
    return entry


def verify(session: Session) -> dict:
    """Walk the whole chain in order; the first entry whose link or content does not check is named."""
    prev, count = GENESIS, 0
    for entry in session.scalars(select(AuditEntry).order_by(AuditEntry.seq)).yield_per(1000):
        if entry.prev_hash != prev:
            return {"ok": False, "entries": count, "broken_at": entry.seq,
                    "reason": "prev_hash does not match the hash of the entry before it (a row was removed or inserted)"}
        if entry_hash(prev, _stamp(entry), entry.tenant, entry.kind, entry.subject, entry.data) != entry.hash:
            return {"ok": False, "entries": count, "broken_at": entry.seq,
                    "reason": "the entry's content does not match its hash (the row was edited)"}
        prev, count = entry.hash, count + 1
    return {"ok": True, "entries": count, "broken_at": None, "head": prev}
