"""A request's records as token ids, computed once per tokenizer and context (issue 27): the unlearning, its
forgetting audit and a connectivity curve of the same job read the same encodings instead of tokenising again.

Two tokenizer objects are the same tokenizer when they encode alike: the fast tokenizer's whole serialisation
(vocabulary, merges, normaliser, pre-tokeniser, post-processor) plus what encode_record reads beside it (EOS,
the chat template). A stored checkpoint's tokenizer, reloaded, is thus the run's. A tokenizer without that
serialisation (a slow one) has no cheap identity: its records are encoded afresh, which is correct, only slower.

Every caller gets its own copies: MASC writes per-record state (focus, targets) into the records it trains on, and
an audit must read them as they were encoded."""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from lethe.engine.data.records import EncodedRecord, encode_records


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """What makes two tokenizers encode the same text the same way; None: not known cheaply (a slow tokenizer)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    digest = hashlib.sha256()
    for part in (type(tokenizer).__name__, backend.to_str(), repr(tokenizer.eos_token_id),
                 getattr(tokenizer, "chat_template", None) or ""):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class TokenisedInputs:
    """forget, retain and holdout as one tokenizer sees them (`seen`: rendered, long documents as windows) and
    their encodings, one per record of `seen`, in the same order."""
    forget: list[dict]
    retain: list[dict]
    holdout: list[dict]
    encoded: dict[str, list[EncodedRecord]]

    @classmethod
    def encode(cls, seen: tuple[list[dict], list[dict], list[dict]], tokenizer: Any, max_length: int,
               seed: int) -> TokenisedInputs:
        forget, retain, holdout = seen
        return cls(forget, retain, holdout,
                   {what: encode_records(records, tokenizer, max_length=max_length, seed=seed, what=what)
                    for what, records in (("forget", forget), ("retain", retain), ("holdout", holdout))})

    def records(self, what: str) -> list[EncodedRecord]:
        """Fresh copies of one set's encodings ("forget", "retain" or "holdout"), the caller's to change."""
        return [dataclasses.replace(r, input_ids=list(r.input_ids), labels=list(r.labels)) for r in self.encoded[what]]
