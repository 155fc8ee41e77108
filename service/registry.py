"""Models and their immutable versions (SPEC section 7): registration, lookup, lineage."""
from __future__ import annotations

import tempfile
from pathlib import Path

import fsspec
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service import audit_log
from service.models import Model, ModelVersion
from service.problems import Problem, invalid, not_found
from service.settings import Settings
from service.store import ArtifactStore, manifest_sha256


def get_model(session: Session, tenant: str, model_id: str) -> Model:
    model = session.get(Model, model_id)
    if model is None or model.tenant != tenant:  # another tenant's id answers 404, not 403
        raise not_found(f"model {model_id!r}")
    return model


def get_version(session: Session, model: Model, number: int | None) -> ModelVersion:
    """Version `number`, or the latest READY one."""
    query = select(ModelVersion).where(ModelVersion.model_id == model.id, ModelVersion.state == "READY")
    if number is None:
        version = session.scalar(query.order_by(ModelVersion.number.desc()).limit(1))
    else:
        version = session.scalar(query.where(ModelVersion.number == number))
    if version is None:
        raise not_found(f"version {number if number is not None else 'latest'} of model {model.id!r}")
    return version


def latest_number(session: Session, model_id: str) -> int | None:
    return session.scalar(select(func.max(ModelVersion.number)).where(ModelVersion.model_id == model_id))


def add_version(session: Session, model: Model, *, location: str, manifest: list[dict], parent: ModelVersion | None,
                job_id: str | None, request_id: str | None, tags: list[str] | None = None) -> ModelVersion:
    """Version n+1 with parent n; its erased request ids are the parent's plus this one."""
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


def copy_source(settings: Settings, store: ArtifactStore, source: str, prefix: str) -> list[dict]:
    """Copy a model source into the store: a local directory under an import root, hf:org/name where a
    network exists, or any fsspec URI. Refusals are 422 problems naming the source."""
    if source.startswith("hf:"):
        try:
            from huggingface_hub import snapshot_download

            with tempfile.TemporaryDirectory() as tmp:
                local = snapshot_download(source[3:], local_dir=tmp)
                return store.put_local_directory(Path(local), prefix)
        except Exception as exc:  # no network, unknown repo, gated model
            raise invalid(f"source {source!r} cannot be fetched: {str(exc).splitlines()[0][:300]}", "source") from None
    if "://" in source:
        try:
            fs, root = fsspec.core.url_to_fs(source)
            if not fs.isdir(root):
                raise invalid(f"source {source!r} is not a directory", "source")
            return store.put_directory(fs, root, prefix)
        except Problem:
            raise
        except Exception as exc:
            raise invalid(f"source {source!r} cannot be read: {str(exc).splitlines()[0][:300]}", "source") from None
    try:
        path = Path(source).expanduser().resolve()
    except (RuntimeError, OSError, ValueError) as exc:  # "~nosuchuser/...": no home directory to expand
        raise invalid(f"source {source!r} is not a path this service can resolve: {exc}", "source") from None
    roots = [Path(r).expanduser().resolve() for r in settings.import_roots]
    if not any(path == root or root in path.parents for root in roots):
        raise invalid(f"source {source!r} is outside the import roots (LETHE_IMPORT_ROOTS)", "source")
    if not path.is_dir():
        raise invalid(f"source {source!r} is not a directory", "source")
    return store.put_local_directory(path, prefix)


def check_loadable(manifest: list[dict], source: str) -> None:
    if not any(entry["path"] == "config.json" for entry in manifest):
        raise invalid(f"source {source!r} has no config.json: not a from_pretrained directory", "source")
