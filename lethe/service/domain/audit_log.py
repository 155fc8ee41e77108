"""The audit log (SPEC section 9): append-only and hash-chained. Each entry's hash covers the previous
entry's hash and its own content, so an edited, inserted or deleted row breaks the chain at that point,
and `verify` names the first broken link.

A chain alone cannot show that its last entries were cut off, or that someone with the database rewrote
it whole and recomputed every hash. So the head is anchored outside the table (issue 12): a checkpoint
(seq, hash) signed with HMAC-SHA256 under a key the database does not hold (LETHE_AUDIT_KEY, or a key
file beside the embedded database), handed out with each report and on request. `verify` with the
checkpoints a client kept fails when an entry they name is gone or has another hash."""
from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from lethe.service.domain import webhooks
from lethe.service.infra.tables import AuditEntry, AuditVerification, utcnow

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
    webhooks.enqueue(session, entry)  # the event's deliveries, in the transaction of the change itself
    return entry


def signing_key(settings) -> bytes:
    """LETHE_AUDIT_KEY, else the key file (created with a random key, readable by this user only)."""
    if settings.audit_key:
        return settings.audit_key.encode()
    return _key_file(str(Path(settings.audit_key_file).resolve()))


@functools.lru_cache
def _key_file(path: str) -> bytes:
    """The key in `path`, made once: written whole to a private temporary file, then linked into place, so
    that processes starting together all read the one key that won, never an empty file."""
    target = Path(path)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=".audit-key-")
        try:
            with os.fdopen(descriptor, "w") as handle:  # mkstemp: mode 0600
                handle.write(secrets.token_hex(32))
            os.link(temporary, target)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            os.unlink(temporary)
    key = target.read_text().strip()
    if len(key) < 32:
        raise RuntimeError(f"the audit key file {path} holds no key")
    return key.encode()


def sign(key: bytes, seq: int, head: str) -> str:
    return hmac.new(key, f"lethe-audit:{seq}:{head}".encode(), hashlib.sha256).hexdigest()


def checkpoint(session: Session, key: bytes) -> dict:
    """The chain's head now, signed: {"seq", "hash", "signature"} (seq 0 and the genesis hash when empty)."""
    last = session.scalar(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1))
    seq, head = (last.seq, last.hash) if last else (0, GENESIS)
    return {"seq": seq, "hash": head, "signature": sign(key, seq, head)}


def verify(session: Session, key: bytes | None = None, checkpoints: Sequence[dict] = (),
           tenant: str | None = None, full: bool = False) -> dict:
    """Walk the chain in order; the first entry whose link or content does not check is named; then every checkpoint
    given must carry our signature and name an entry that is still there with that hash. With the key, the walk
    starts after the last verified point (a signed AuditVerification whose entry still has its hash) unless `full`;
    a whole chain is recorded as the new verified point. `tenant`: count that tenant's entries only."""
    start = None if full or key is None else _verified_point(session, key)
    if start is not None and start.get("broken_at"):
        return {**start, "entries": _count(session, tenant), "from_seq": 0}
    prev, after = (start["hash"], start["seq"]) if start else (GENESIS, 0)
    last_seq, walked = after, 0
    for entry in session.scalars(select(AuditEntry).where(AuditEntry.seq > after)
                                 .order_by(AuditEntry.seq)).yield_per(1000):
        if entry.prev_hash != prev:
            return {"ok": False, "entries": _count(session, tenant), "broken_at": entry.seq, "from_seq": after,
                    "reason": "prev_hash does not match the hash of the entry before it "
                              "(a row was removed or inserted)"}
        if entry_hash(prev, _stamp(entry), entry.tenant, entry.kind, entry.subject, entry.data) != entry.hash:
            return {"ok": False, "entries": _count(session, tenant), "broken_at": entry.seq, "from_seq": after,
                    "reason": "the entry's content does not match its hash (the row was edited)"}
        prev, last_seq, walked = entry.hash, entry.seq, walked + 1
    for given in checkpoints:
        if problem := _check_kept(session, key, given):
            return {"ok": False, "entries": _count(session, tenant), "broken_at": int(given["seq"]),
                    "from_seq": after, "reason": problem}
    if key is not None and walked:
        session.add(AuditVerification(seq=last_seq, hash=prev, signature=sign(key, last_seq, prev)))
    return {"ok": True, "entries": _count(session, tenant), "broken_at": None, "from_seq": after,
            "walked": walked, "checkpoints_checked": len(checkpoints)}


def _verified_point(session: Session, key: bytes) -> dict | None:
    """The last point the chain was verified to, if its record is ours and its entry unchanged: {"seq", "hash"}; a
    failure dict where the entry it names is gone or has another hash (the chain was cut back or rewritten)."""
    for point in session.scalars(select(AuditVerification).order_by(AuditVerification.seq.desc()).limit(20)):
        if not hmac.compare_digest(sign(key, point.seq, point.hash), point.signature):
            continue  # not signed by us: never trusted, an older one may be
        stored = session.scalar(select(AuditEntry.hash).where(AuditEntry.seq == point.seq))
        if stored != point.hash:
            return {"ok": False, "broken_at": point.seq,
                    "reason": "the entry the last verification ended at is gone or has another hash (the chain was "
                              "cut back or rewritten)"}
        return {"seq": point.seq, "hash": point.hash}
    return None


def _check_kept(session: Session, key: bytes | None, given: dict) -> str | None:
    """Why a checkpoint a client kept does not hold, or None."""
    seq, head = int(given["seq"]), str(given["hash"])
    if key is None or not hmac.compare_digest(sign(key, seq, head), str(given.get("signature", ""))):
        return "a checkpoint's signature is not this service's (forged or altered)"
    if not seq:
        return None
    stored = session.scalar(select(AuditEntry.hash).where(AuditEntry.seq == seq))
    if stored is None:
        return "the entry a signed checkpoint names is gone (the chain was cut back)"
    if stored != head:
        return "the entry a signed checkpoint names has another hash (the chain was rewritten)"
    return None


def _count(session: Session, tenant: str | None) -> int:
    query = select(func.count()).select_from(AuditEntry)
    return session.scalar(query.where(AuditEntry.tenant == tenant) if tenant is not None else query) or 0
