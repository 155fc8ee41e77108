"""The report's examples (issue 26): answers the models generated for the forget records, quoted only where the
request asked (`audit.examples`), and kept for LETHE_EXAMPLES_RETENTION_SECONDS. Then each text is replaced by its
sha256. The report's own sha256 commits to every example by its hash, so a scrubbed report still checks against the
hash the audit log recorded, and a kept copy of an example can still be matched to it."""
from __future__ import annotations

import copy
import hashlib

from lethe.service.domain.digests import canonical_sha256

UNHASHED = ("sha256", "audit_checkpoint", "examples_scrubbed_at")  # added after the hash, or by the scrub


def example_maps(report: dict) -> list[dict]:
    """Each {record id: generated text} the report quotes (the base's answers and the new version's)."""
    audit = report.get("audit") or {}
    maps = []
    for side in ("before", "after"):
        generated = ((audit.get(side) or {}).get("forget_verbatim") or {}).get("generated")
        if isinstance(generated, dict):
            maps.append(generated)
    return maps


def has_examples(report: dict) -> bool:
    return any(isinstance(text, str) for generated in example_maps(report) for text in generated.values())


def _digest(text: str) -> dict:
    return {"sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()}


def scrubbed(report: dict) -> dict:
    """A copy of `report` with every example text replaced by {"sha256": ...}."""
    out = copy.deepcopy(report)
    for generated in example_maps(out):
        for record_id, text in generated.items():
            if isinstance(text, str):
                generated[record_id] = _digest(text)
    return out


def report_sha256(report: dict) -> str:
    """The report's hash: over its content with each example by its sha256, and without the fields added after."""
    committed = {k: v for k, v in scrubbed(report).items() if k not in UNHASHED}
    return canonical_sha256(committed)
