"""/v1/models: registration, versions, and their files (streamed, Range, ETag = sha256, tar archive)."""
from __future__ import annotations

import re
import tarfile

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.engine.contract.chat_format import check_format
from lethe.engine.contract.record_checks import normalise_records
from lethe.service.api.auth import Principal, require
from lethe.service.api.idempotency import idempotent
from lethe.service.api.pagination import paginate
from lethe.service.api.schemas import MAX_VERSION, ModelCreate, ModelOut, ModelUpdate, Page, VersionOut
from lethe.service.domain import audit_log, capacity, lineage, retirement
from lethe.service.domain.checkpoints import check_chat_template
from lethe.service.domain.errors import Problem, invalid, not_found
from lethe.service.domain.sources import copy_source
from lethe.service.infra.artifacts import STREAM_CHUNK, ArtifactStore, artifact_store
from lethe.service.infra.db import INJECTED, transactional
from lethe.service.infra.tables import Model, ModelVersion, new_id
from lethe.service.settings import get_settings

router = APIRouter(prefix="/v1/models", tags=["models"])


def store() -> ArtifactStore:
    """The artifact store the settings name."""
    return artifact_store(get_settings())


def model_out(session: Session, model: Model) -> dict:
    """A model as the API shows it: its retain set by count, its head version by number."""
    return {"id": model.id, "name": model.name, "source": model.source, "format": model.format,
            "description": model.description,
            "retain_count": len(model.retain_records or []), "utility_count": len(model.utility_records or []),
            "retire_predecessors": model.retire_predecessors,
            "anchor_version": model.anchor_version or 1,
            "latest_version": getattr(lineage.head_version(session, model), "number", None),
            "created_at": model.created_at}


def version_out(v: ModelVersion) -> dict:
    """A version as the API shows it: lineage, manifest hash and size, erasures held, tags."""
    return {"model_id": v.model_id, "number": v.number, "parent": v.parent_number, "job_id": v.job_id,
            "state": v.state, "manifest_sha256": v.manifest_sha256, "files": len(v.manifest),
            "size_bytes": sum(f["size"] for f in v.manifest), "erased_request_ids": v.erased_request_ids,
            "tags": v.tags, "created_at": v.created_at, "retired_at": v.retired_at, "purged_at": v.purged_at}


@router.post("", status_code=201, response_model=ModelOut)
@transactional
def create_model(body: ModelCreate, request: Request, who: Principal = Depends(require("models:write")),
                 session: Session = INJECTED, idempotency_key: str | None = Header(None)):
    """Register a lineage root (a folder under an import root, hf:org/name, or s3:// in an allowed bucket): its
    files are copied into the store as version 1."""
    def create():
        retain = normalise_records(body.retain, "retain") if body.retain is not None else None
        utility = normalise_records(body.utility, "utility") if body.utility is not None else None
        if session.scalar(select(Model).where(Model.tenant == who.tenant, Model.name == body.name)):
            raise Problem(409, "conflict", "Conflict", f"a model named {body.name!r} exists")
        model = Model(id=new_id("mdl"), tenant=who.tenant, name=body.name, source=body.source,
                      description=body.description, retain_records=retain, utility_records=utility,
                      format=check_format(body.format), retire_predecessors=body.retire_predecessors)
        location = f"models/{model.id}/v1"
        artifacts = store()
        try:
            manifest = copy_source(get_settings(), artifacts, body.source, location, who.tenant)
            check_chat_template(model.format, location)
            session.add(model)
            session.flush()  # a concurrent twin with the same name fails here (idempotent() answers it)
            version = lineage.add_version(session, model, location=location, manifest=manifest, parent=None,
                                          job_id=None, request_id=None, tags=["source"])
            capacity.version_parameters(artifacts, version)  # read once here; submissions read the row
            session.flush()
        except BaseException:  # nothing half-copied stays behind, not even the model's empty folder
            artifacts.delete(f"models/{model.id}")
            raise
        return 201, model_out(session, model), f"/v1/models/{model.id}"

    return idempotent(session, who, request, idempotency_key, body.model_dump(mode="json"), create)


@router.get("", response_model=Page)
@transactional
def list_models(who: Principal = Depends(require("jobs:read")), session: Session = INJECTED,
                page_size: int = Query(50, ge=1, le=500), page_token: str | None = None):
    """The tenant's models, newest first, paginated."""
    rows, token = paginate(session, select(Model).where(Model.tenant == who.tenant), Model, page_size, page_token)
    return {"items": [model_out(session, m) for m in rows], "next_page_token": token}


@router.get("/{model_id}", response_model=ModelOut)
@transactional
def read_model(model_id: str, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """One model."""
    return model_out(session, lineage.get_model(session, who.tenant, model_id))


@router.get("/{model_id}/versions", response_model=Page)
@transactional
def list_versions(model_id: str, who: Principal = Depends(require("jobs:read")),
                  session: Session = INJECTED):
    """A model's versions, oldest first (version 1 is the registered source), in one page."""
    model = lineage.get_model(session, who.tenant, model_id)
    rows = session.scalars(select(ModelVersion).where(ModelVersion.model_id == model.id)
                           .order_by(ModelVersion.number)).all()
    return {"items": [version_out(v) for v in rows], "next_page_token": None}


VERSION_NUMBER = re.compile(r"[1-9][0-9]{0,8}")  # up to MAX_VERSION


def _version(session, who, model_id, number: str, served: bool = True) -> ModelVersion:
    """A version by number, or the alias `latest` (the head: the newest version holding every erasure). `served`:
    one whose files are served (410 Gone for a retired or purged one); else in any state."""
    if number != "latest" and not VERSION_NUMBER.fullmatch(number):  # ASCII digits only: "²" and "١" are not 2 and 1
        raise invalid(f"version {number!r}: expected a number from 1 to {MAX_VERSION} or 'latest'", "number")
    model = lineage.get_model(session, who.tenant, model_id)
    if number == "latest" or served:
        return lineage.get_version(session, model, None if number == "latest" else int(number))
    return lineage.find_version(session, model, int(number))


@router.patch("/{model_id}", response_model=ModelOut)
@transactional
def update_model(model_id: str, body: ModelUpdate, who: Principal = Depends(require("models:write")),
                 session: Session = INJECTED):
    """Change a model's settings (retire_predecessors; anchor_version, a version whose files are kept, null for the
    root; the utility set); audited."""
    model = lineage.get_model(session, who.tenant, model_id)
    utility = normalise_records(body.utility, "utility", allow_empty=True) if body.utility is not None else None
    if body.retire_predecessors is not None and body.retire_predecessors != model.retire_predecessors:
        model.retire_predecessors = body.retire_predecessors
        audit_log.append(session, who.tenant, "model.updated", model.id,
                         {"retire_predecessors": body.retire_predecessors})
    if "anchor_version" in body.model_fields_set and body.anchor_version != model.anchor_version:
        if body.anchor_version is not None:
            lineage.get_version(session, model, body.anchor_version, (lineage.SERVED, lineage.RETIRED))
        model.anchor_version = body.anchor_version
        audit_log.append(session, who.tenant, "model.updated", model.id, {"anchor_version": body.anchor_version})
    if utility is not None:
        model.utility_records = utility or None
        audit_log.append(session, who.tenant, "model.updated", model.id, {"utility_count": len(utility)})
    return model_out(session, model)


@router.get("/{model_id}/versions/{number}", response_model=VersionOut)
@transactional
def read_version(model_id: str, number: str, who: Principal = Depends(require("jobs:read")),
                 session: Session = INJECTED):
    """One version, by number (in any state: served, retired or purged) or `latest` (the head: the newest version
    that holds every erasure)."""
    return version_out(_version(session, who, model_id, number, served=False))


@router.post("/{model_id}/versions/{number}:retire", response_model=VersionOut)
@transactional
def retire_version(model_id: str, number: str, who: Principal = Depends(require("models:write")),
                   session: Session = INJECTED):
    """Stop serving a version: its downloads answer 410 Gone from now on; its files stay stored, its lineage, manifest
    and audit stay readable. Not the head (409). Audited and announced (version.retired). Again: no change."""
    version = _version(session, who, model_id, number, served=False)
    retirement.retire(session, lineage.get_model(session, who.tenant, model_id), version)
    return version_out(version)


@router.post("/{model_id}/versions/{number}:purge", response_model=VersionOut)
@transactional
def purge_version(model_id: str, number: str, who: Principal = Depends(require("models:write")),
                  session: Session = INJECTED):
    """Delete a version's files (retiring it first): downloads answer 410 Gone, the manifest (each file's sha256),
    lineage and audit stay. Not the head, nor a version a job not yet ended reads (409). Audited and announced
    (version.purged). Cannot be undone."""
    version = _version(session, who, model_id, number, served=False)
    retirement.purge(session, store(), lineage.get_model(session, who.tenant, model_id), version)
    return version_out(version)


@router.get("/{model_id}/versions/{number}/files")
@transactional
def list_files(model_id: str, number: str, who: Principal = Depends(require("artifacts:read")),
               session: Session = INJECTED):
    """A version's manifest: every file with its size and sha256 (kept after a purge; `state` says whether the files
    are still served)."""
    v = _version(session, who, model_id, number, served=False)
    return {"manifest_sha256": v.manifest_sha256, "state": v.state, "files": v.manifest}


# ASCII digits only; a position of more than 19 digits lies past any file (parsed as HUGE, never as an int of
# thousands of digits): a first byte there is 416, a last byte or a suffix length there is clamped (RFC 9110 14.1.2).
RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
HUGE = 10 ** 19


def _position(digits: str) -> int:
    return int(digits) if len(digits) <= 19 else HUGE


@router.get("/{model_id}/versions/{number}/files/{path:path}")
@transactional
def download_file(model_id: str, number: str, path: str, who: Principal = Depends(require("artifacts:read")),
                  session: Session = INJECTED, range_header: str | None = Header(None, alias="range"),
                  if_none_match: str | None = Header(None)):
    """One file of a version, streamed; honours Range; ETag is the file's sha256."""
    v = _version(session, who, model_id, number)
    entry = next((f for f in v.manifest if f["path"] == path), None)
    if entry is None:
        raise not_found(f"file {path!r} of version {v.number}")
    etag, size = f'"{entry["sha256"]}"', entry["size"]
    headers = {"ETag": etag, "Accept-Ranges": "bytes"}
    if if_none_match == etag:
        return Response(status_code=304, headers=headers)
    start, end = 0, size - 1
    status = 200
    if range_header:
        match = RANGE.match(range_header.strip())
        if not match or match.groups() == ("", ""):
            raise Problem(416, "range-not-satisfiable", "Range not satisfiable", f"cannot serve {range_header!r}",
                          headers={"Content-Range": f"bytes */{size}"})
        first, last = match.groups()
        if first == "":  # the last N bytes; N past the size is the whole file
            start, end = max(0, size - _position(last)), size - 1
        else:  # a last byte past the end is the end
            start, end = _position(first), min(_position(last), size - 1) if last else size - 1
        if start >= size or start > end:
            raise Problem(416, "range-not-satisfiable", "Range not satisfiable", f"{range_header!r} of {size} bytes",
                          headers={"Content-Range": f"bytes */{size}"})
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    headers["Content-Length"] = str(end - start + 1)
    location = v.location

    def body():
        with store().open(location, path) as handle:
            handle.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = handle.read(min(STREAM_CHUNK, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                yield chunk

    return StreamingResponse(body(), status_code=status, headers=headers, media_type="application/octet-stream")


@router.get("/{model_id}/versions/{number}/archive")
@transactional
def download_archive(model_id: str, number: str, who: Principal = Depends(require("artifacts:read")),
                     session: Session = INJECTED):
    """A version's whole directory as one streamed tar."""
    v = _version(session, who, model_id, number)
    manifest, location = v.manifest, v.location
    name = f"{lineage.get_model(session, who.tenant, model_id).name}-v{v.number}"

    mtime = int(v.created_at.timestamp())

    def body():
        # tar written by hand, one block at a time, so a multi-GB shard is never held in memory.
        artifacts = store()
        for entry in manifest:
            info = tarfile.TarInfo(f"{name}/{entry['path']}")
            info.size, info.mode, info.mtime = entry["size"], 0o644, mtime
            yield info.tobuf(format=tarfile.PAX_FORMAT)
            with artifacts.open(location, entry["path"]) as handle:
                while chunk := handle.read(STREAM_CHUNK):
                    yield chunk
            yield b"\0" * (-entry["size"] % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)

    return StreamingResponse(body(), media_type="application/x-tar",
                             headers={"Content-Disposition": f'attachment; filename="{name}.tar"',
                                      "X-Manifest-SHA256": v.manifest_sha256})
