"""Versions that predate an erasure, taken out of service (issue 26). Retired: its files stay in the store but are
no longer served (downloads answer 410 Gone), its lineage and audit stay. Purged: its files are deleted, its manifest
(every file's sha256) kept, so the record of what was served survives the data. Both are audit-log entries and
webhook events; neither can be undone. The head (the version new jobs start from) is neither retired nor purged."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.service.domain import audit_log
from lethe.service.domain.errors import Problem
from lethe.service.domain.lineage import (
    PURGED,
    RETIRED,
    SERVED,
    erasures_done,
    head_version,
    lock_model,
    missing_erasures,
)
from lethe.service.infra.artifacts import ArtifactStore
from lethe.service.infra.tables import TERMINAL, Job, Model, ModelVersion, RetrainReference, utcnow


def retire(session: Session, model: Model, version: ModelVersion, reason: str = "requested") -> bool:
    """Stop serving `version`. False where it was retired already (nothing changes, nothing is logged)."""
    lock_model(session, model.id)
    if version.state in (RETIRED, PURGED):
        return False
    _not_the_head(session, model, version, "retired")
    version.state, version.retired_at = RETIRED, utcnow()
    audit_log.append(session, model.tenant, "version.retired", f"{model.id}/v{version.number}",
                     {"reason": reason, "missing_erasures": missing_erasures(session, version)})
    return True


def purge(session: Session, store: ArtifactStore, model: Model, version: ModelVersion) -> bool:
    """Delete `version`'s files, keep its manifest. False where it was purged already. Refused (409) while a job that
    has not ended needs its files. The files go after the row changes are flushed; a crash in between leaves a purged
    row with some files still stored, which a second purge call deletes."""
    lock_model(session, model.id)
    if version.state == PURGED:
        store.delete(version.location)  # finishes a purge a crash interrupted; nothing when already gone
        return False
    _not_the_head(session, model, version, "purged")
    if user := _active_user(session, model, version.number):
        raise Problem(409, "version-in-use", "Version in use",
                      f"version {version.number} is read by job {user}, which has not ended; purge it after")
    if version.retired_at is None:
        version.retired_at = utcnow()
    version.state, version.purged_at = PURGED, utcnow()
    audit_log.append(session, model.tenant, "version.purged", f"{model.id}/v{version.number}",
                     {"manifest_sha256": version.manifest_sha256, "files": len(version.manifest),
                      "missing_erasures": missing_erasures(session, version)})
    session.flush()
    store.delete(version.location)
    return True


def retire_predecessors(session: Session, model: Model) -> list[int]:
    """The model's setting `retire_predecessors`, applied after an erasure succeeded: every served version that
    lacks an erasure done on the model is retired. The numbers retired."""
    if not model.retire_predecessors:
        return []
    done = erasures_done(session, model.id)
    served = session.scalars(select(ModelVersion).where(ModelVersion.model_id == model.id,
                                                        ModelVersion.state == SERVED)
                             .order_by(ModelVersion.number)).all()
    lacking = [v for v in served if not done <= set(v.erased_request_ids or [])]
    return [v.number for v in lacking if retire(session, model, v, "superseded")]


def _not_the_head(session: Session, model: Model, version: ModelVersion, what: str) -> None:
    head = head_version(session, model)
    if head is not None and head.id == version.id:
        raise Problem(409, "version-is-head", "Version is the head",
                      f"version {version.number} is the head of model {model.id} (what 'latest' names and new jobs "
                      f"start from); it can be {what} once a newer version holds every erasure")


def _active_user(session: Session, model: Model, number: int) -> str | None:
    """A job not ended that reads the version: its base, a connectivity end, or the retrain reference."""
    jobs = session.scalars(select(Job).where(Job.model_id == model.id, Job.state.not_in(TERMINAL))).all()
    is_reference = session.scalar(select(RetrainReference.id).where(RetrainReference.model_id == model.id,
                                                                    RetrainReference.version_number == number))
    for job in jobs:
        options = job.mcu_options or {}
        starts_there = job.base_version == number and not (job.follows_head and job.state == "QUEUED")
        if (starts_there or number in options.get("against", [])
                or number in (options.get("a"), options.get("b")) or (is_reference and job.kind != "connectivity")):
            return job.id
    return None
