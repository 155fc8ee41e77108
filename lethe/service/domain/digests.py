"""Hashes of request data (issue 26). What the service keeps of erased records, their secrets and the data subjects
a request named is a keyed hash: HMAC-SHA256 under a key the database does not hold (derived from the audit key:
LETHE_AUDIT_KEY or its key file), so that someone with the database cannot confirm a guess (a phone number is 10^10
guesses, an e-mail list names who asked for erasure). Each keyed value is the HMAC of the content's plain sha256,
which let migration 0011 re-key the rows that held plain hashes without the plaintext."""
from __future__ import annotations

import hashlib
import hmac
import json

from lethe.service.settings import get_settings

LABEL = b"lethe-evidence-v1"  # the derivation label: the audit key signs checkpoints, this key hashes data


def canonical_sha256(value) -> str:
    """sha256 of `value` as canonical JSON (sorted keys, no spaces, UTF-8)."""
    # surrogatepass: a lone surrogate in a body still hashes (and is then refused by the record checks)
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode("utf-8", "surrogatepass")).hexdigest()


def evidence_key(audit_key: bytes) -> bytes:
    return hmac.new(audit_key, LABEL, hashlib.sha256).digest()


def rekey(sha256_hex: str, key: bytes) -> str:
    """The keyed form of a plain sha256 (hex)."""
    return hmac.new(key, sha256_hex.encode(), hashlib.sha256).hexdigest()


def current_key() -> bytes:
    from lethe.service.domain.audit_log import signing_key  # the audit log's key source, one place

    return evidence_key(signing_key(get_settings()))
