"""Where a model may come from, and copying it into the store (issue 12).

Three kinds of source, nothing else: a local directory under an import root (LETHE_IMPORT_ROOTS), a Hub
repository as `hf:org/name` (where a network exists), and `s3://bucket/prefix` in a bucket the operator
allows (LETHE_S3_BUCKETS). Any other URL (file://, zip://, http(s)://, memory://, chained fsspec URLs) is
refused: fsspec would read the server's disk, fetch URLs for a client (SSRF) or unpack an archive whose
paths escape the version folder. Inside an import root a symlink is followed only when its target lies
under the same root (Hub caches link snapshots to blobs that way); one that leaves it is refused.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.model_files import check_model_files
from lethe.service.domain.errors import Problem, invalid
from lethe.service.infra.artifacts import ArtifactStore, safe_relative, url_to_fs
from lethe.service.settings import Settings

BUCKET = re.compile(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(/.*)?$")


def copy_source(settings: Settings, store: ArtifactStore, source: str, prefix: str, tenant: str) -> list[dict]:
    """Copy a model source into the store under `prefix`; returns the manifest. Refusals are 422 problems
    naming the source, raised before a byte is copied. `tenant`: whose grants apply (the import roots and buckets
    every tenant may read, and the tenant's own)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in source) or not source.strip():
        raise invalid("source must be a path or URL without control characters", "source")
    if source.startswith("hf:"):
        return _copy_hub(settings, store, source, prefix)
    if source.startswith("s3://"):
        return _copy_s3(settings, store, source, prefix, tenant)
    if "://" in source or "::" in source or re.match(r"^[A-Za-z][A-Za-z0-9+.\-]+:", source):
        raise invalid(f"source {source!r}: unsupported kind; a model comes from a directory under the import "
                      "roots (LETHE_IMPORT_ROOTS), hf:org/name, or s3://bucket/prefix in an allowed bucket", "source")
    return _copy_local(settings, store, source, prefix, tenant)


def _copy_hub(settings: Settings, store: ArtifactStore, source: str, prefix: str) -> list[dict]:
    try:
        from huggingface_hub import HfApi, snapshot_download

        # The size from the Hub's listing first: a client must not make the server fill its disk.
        listed = HfApi().model_info(source[3:], files_metadata=True).siblings or []
        total = sum(f.size or 0 for f in listed)
        if total > settings.max_source_bytes:
            raise invalid(f"source {source!r} holds {total} bytes, over this service's limit of "
                          f"{settings.max_source_bytes} (LETHE_MAX_SOURCE_BYTES)", "source")
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(snapshot_download(source[3:], local_dir=tmp))
            files = _local_files(local, local)
            _check_files(settings, files, source)
            return store.put_files(files, prefix)
    except Problem:
        raise
    except Exception as exc:  # no network, unknown repo, gated model
        raise invalid(f"source {source!r} cannot be fetched: {str(exc).splitlines()[0][:300]}", "source") from None


def _copy_s3(settings: Settings, store: ArtifactStore, source: str, prefix: str, tenant: str) -> list[dict]:
    match = BUCKET.match(source)
    if not match:
        raise invalid(f"source {source!r} is not s3://bucket/prefix", "source")
    if match.group(1) not in settings.s3_buckets_of(tenant):
        raise invalid(f"source {source!r}: bucket {match.group(1)!r} is not one this service may read "
                      "(LETHE_S3_BUCKETS)", "source")
    try:
        fs, root = url_to_fs(source, settings)
        if not fs.isdir(root):
            raise invalid(f"source {source!r} is not a directory", "source")
        paths = sorted(p for p in fs.find(root) if fs.isfile(p))
        files = [(safe_relative(str(Path(p).relative_to(root))), fs.size(p), lambda p=p: fs.open(p, "rb"))
                 for p in paths]
        _check_files(settings, files, source)
        return store.put_files(files, prefix)
    except Problem:
        raise
    except Exception as exc:
        raise invalid(f"source {source!r} cannot be read: {str(exc).splitlines()[0][:300]}", "source") from None


def _copy_local(settings: Settings, store: ArtifactStore, source: str, prefix: str, tenant: str) -> list[dict]:
    try:
        path = Path(source).expanduser().resolve()
    except (RuntimeError, OSError, ValueError) as exc:  # "~nosuchuser/...": no home directory to expand
        raise invalid(f"source {source!r} is not a path this service can resolve: {exc}", "source") from None
    roots = [Path(r).expanduser().resolve() for r in settings.import_roots_of(tenant)]
    root = next((r for r in roots if path == r or r in path.parents), None)
    if root is None:
        raise invalid(f"source {source!r} is outside the import roots (LETHE_IMPORT_ROOTS)", "source")
    own = store.local_path("")
    if own is not None and (path == own.resolve() or own.resolve() in path.parents):
        # An import root that holds the store would let a tenant register any tenant's stored versions.
        raise invalid(f"source {source!r} lies in this service's artifact store; register a model from its own "
                      "folder", "source")
    if not path.is_dir():
        raise invalid(f"source {source!r} is not a directory", "source")
    files = _local_files(path, root)
    _check_files(settings, files, source)
    return store.put_files(files, prefix)


def _local_files(directory: Path, root: Path) -> list[tuple]:
    """(relative path, size, opener) for every file below `directory`, refusing a link that leaves `root`."""
    out = []
    for folder, dirs, names in os.walk(directory, followlinks=False):
        for name in sorted(dirs):
            if (Path(folder) / name).is_symlink():
                raise invalid(f"source has a linked folder {name!r}: not followed", "source")
        for name in sorted(names):
            link = Path(folder) / name
            target = link.resolve()
            if target != link and not (target.is_relative_to(root)):
                raise invalid(f"source file {str(link.relative_to(directory))!r} links outside the import root",
                              "source")
            if not target.is_file():
                continue  # a socket, a dangling link: not part of a model
            rel = safe_relative(str(link.relative_to(directory)))
            out.append((rel, target.stat().st_size, lambda t=target: open(t, "rb")))
    return sorted(out, key=lambda f: f[0])


def _check_files(settings: Settings, files: list[tuple], source: str) -> None:
    """Before copying: a from_pretrained directory (config.json at its top) of a size the operator allows, whose
    JSON names no file outside it and no code (lethe.engine.contract.model_files)."""
    if not any(rel == "config.json" for rel, _, _ in files):
        raise invalid(f"source {source!r} has no config.json: not a from_pretrained directory", "source")
    total = sum(size for _, size, _ in files)
    if total > settings.max_source_bytes:
        raise invalid(f"source {source!r} holds {total} bytes, over this service's limit of "
                      f"{settings.max_source_bytes} (LETHE_MAX_SOURCE_BYTES)", "source")
    openers = {rel: opener for rel, _, opener in files}

    def read(name: str, limit: int) -> bytes:
        with openers[name]() as f:
            return f.read(limit)

    try:  # the files are data, never directions: nothing in them may point outside the folder or name code
        check_model_files(openers, read, field="source")
    except EngineInputError as exc:
        raise invalid(f"source {source!r}: {exc}", "source") from None
