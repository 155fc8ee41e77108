"""Models and their immutable versions (SPEC section 7): registration, lookup, lineage."""
from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from lethe.service.domain import audit_log
from lethe.service.domain.errors import Problem, not_found
from lethe.service.infra.artifacts import manifest_sha256
from lethe.service.infra.tables import Model, ModelVersion

NOT_FORGOTTEN = "not-forgotten"  # a version whose own audit did not find an erasure it was made for: never the head
SERVED, RETIRED, PURGED = "READY", "RETIRED", "PURGED"  # a version's states (lethe.service.domain.retirement)


def get_model(session: Session, tenant: str, model_id: str) -> Model:
    model = session.get(Model, model_id)
    if model is None or model.tenant != tenant:  # another tenant's id answers 404, not 403
        raise not_found(f"model {model_id!r}")
    return model


def get_version(session: Session, model: Model, number: int | None,
                usable: tuple[str, ...] = (SERVED,)) -> ModelVersion:
    """Version `number` in one of the `usable` states (410 Gone where it was retired or purged), or the head (see
    head_version)."""
    if number is None:
        version = head_version(session, model)
        if version is None:
            raise not_found(f"a version of model {model.id!r} that holds every erasure done on it")
        return version
    version = find_version(session, model, number)
    if version.state not in usable:
        when = version.purged_at if version.state == PURGED else version.retired_at
        raise Problem(410, "version-gone", f"Version {version.state.lower()}",
                      f"version {number} of model {model.id!r} was {version.state.lower()} at {when}: it is no "
                      "longer served (its lineage and manifest stay readable)")
    return version


def find_version(session: Session, model: Model, number: int) -> ModelVersion:
    """Version `number` whatever its state (404 where there is none)."""
    version = session.scalar(select(ModelVersion).where(ModelVersion.model_id == model.id,
                                                        ModelVersion.number == number))
    if version is None:
        raise not_found(f"version {number} of model {model.id!r}")
    return version


def erasures_done(session: Session, model_id: str) -> set[str]:
    """Every request erased on some version of the model."""
    rows = session.scalars(select(ModelVersion.erased_request_ids).where(ModelVersion.model_id == model_id)).all()
    return {rid for erased in rows for rid in erased or []}


def head_version(session: Session, model: Model) -> ModelVersion | None:
    """The version `latest` names and new jobs start from: the newest READY version that holds every erasure
    done on the model and is not tagged not-forgotten. A newer version that lacks one (an MCU ensemble mixed with an
    older version, unless its own audit found the request erased) is never the head, so no job starts again from
    data that was erased."""
    versions = session.scalars(select(ModelVersion).where(ModelVersion.model_id == model.id)
                               .order_by(ModelVersion.number.desc())).all()
    done = {rid for v in versions for rid in v.erased_request_ids or []}  # as erasures_done, from this one read
    return next((v for v in versions if v.state == SERVED and done <= set(v.erased_request_ids or [])
                 and NOT_FORGOTTEN not in (v.tags or [])), None)


def missing_erasures(session: Session, version: ModelVersion) -> list[str]:
    """Requests erased on the model that this version does not hold (it predates them or mixes in a version
    that does)."""
    return sorted(erasures_done(session, version.model_id) - set(version.erased_request_ids or []))


def latest_number(session: Session, model_id: str) -> int | None:
    return session.scalar(select(func.max(ModelVersion.number)).where(ModelVersion.model_id == model_id))


def lock_model(session: Session, model_id: str) -> None:
    """Hold the model's row until the transaction ends (PostgreSQL: a row lock; SQLite: the write lock a
    write takes): versions of one model are numbered, and jobs of one model started, one at a time."""
    session.execute(update(Model).where(Model.id == model_id).values(name=Model.name)
                    .execution_options(synchronize_session=False))


def add_version(session: Session, model: Model, *, location: str, manifest: list[dict], parent: ModelVersion | None,
                job_id: str | None, request_id: str | None, tags: list[str] | None = None,
                erased: list[str] | None = None) -> ModelVersion:
    """Version n+1 with parent n; its erased request ids are the parent's plus this one (or `erased`, for a
    version built from more than its parent). The model's row is locked first, so two versions finishing
    together get n+1 and n+2 instead of one unique-constraint failure (PostgreSQL: a row lock; SQLite: the
    write lock this update takes)."""
    lock_model(session, model.id)
    if erased is None:
        erased = list(parent.erased_request_ids) if parent else []
        if request_id and request_id not in erased:
            erased.append(request_id)
    version = ModelVersion(model_id=model.id, number=(latest_number(session, model.id) or 0) + 1,
                           parent_number=parent.number if parent else None, job_id=job_id, state="READY",
                           location=location, manifest=manifest, manifest_sha256=manifest_sha256(manifest),
                           erased_request_ids=erased, tags=tags or [])
    session.add(version)
    session.flush()
    audit_log.append(session, model.tenant, "version.created", f"{model.id}/v{version.number}",
                     {"parent": version.parent_number, "job_id": job_id, "manifest_sha256": version.manifest_sha256,
                      "erased_request_ids": erased})
    return version
