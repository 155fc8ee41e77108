"""The artifact store: model directories under a local root or any fsspec URI (s3://...), with a
manifest of every file's size and sha256 computed while it is copied in."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import fsspec

CHUNK = 1 << 20
STREAM_CHUNK = 8 << 20  # downloads: fewer hops through the thread pool per byte


def safe_relative(rel: str) -> str:
    """A file's path inside a version folder, in POSIX form; ValueError for one that could leave it."""
    path = PurePosixPath(rel.replace("\\", "/"))
    if not rel or path.is_absolute() or any(part in ("..", "") for part in path.parts) or "\x00" in rel:
        raise ValueError(f"file path {rel!r} is not a plain path inside the model folder")
    return str(path)


def manifest_sha256(manifest: list[dict]) -> str:
    canonical = json.dumps(sorted(manifest, key=lambda e: e["path"]), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def s3_options(settings) -> dict:
    """fsspec's options for s3:// URLs: an S3-compatible endpoint (MinIO, moto, R2) where one is set, and the part
    size of multipart uploads (a file larger than one part is uploaded in parts)."""
    options: dict = {"default_block_size": settings.s3_part_bytes}
    if settings.s3_endpoint_url:
        options["client_kwargs"] = {"endpoint_url": settings.s3_endpoint_url}
    return options


def url_to_fs(url: str, settings) -> tuple:
    """fsspec's filesystem and path for a URL, with the service's S3 options where it is s3://."""
    return fsspec.core.url_to_fs(url, **(s3_options(settings) if url.startswith("s3://") else {}))


def artifact_store(settings) -> ArtifactStore:
    return ArtifactStore(settings.artifact_root, s3_options(settings) if settings.artifact_root.startswith("s3://")
                         else None)


class ArtifactStore:
    def __init__(self, root: str, storage_options: dict | None = None):
        self.fs, self.root = fsspec.core.url_to_fs(root, **(storage_options or {}))
        self.is_local = "file" in self.fs.protocol
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def _path(self, prefix: str, rel: str = "") -> str:
        return "/".join([self.root.rstrip("/"), prefix.strip("/")] + ([rel.lstrip("/")] if rel else []))

    def put_files(self, files: list[tuple[str, int, Callable]], prefix: str) -> list[dict]:
        """Copy (relative path, size, opener) files into prefix; returns the manifest. Each path is checked
        to stay under prefix (no "..", no absolute path) before anything is written."""
        files = [(safe_relative(rel), size, opener) for rel, size, opener in files]
        manifest = []
        for rel, _, opener in files:
            digest, size = hashlib.sha256(), 0
            target = self._path(prefix, rel)
            if self.is_local and not Path(target).resolve().is_relative_to(Path(self._path(prefix)).resolve()):
                raise ValueError(f"{rel!r} would be written outside {prefix!r}")
            self.fs.makedirs(str(PurePosixPath(target).parent), exist_ok=True)
            with opener() as src, self.fs.open(target, "wb") as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    dst.write(chunk)
            manifest.append({"path": rel, "size": size, "sha256": digest.hexdigest()})
        return manifest

    def put_local_directory(self, directory: Path, prefix: str) -> list[dict]:
        """Copy a folder this process wrote (a saved model) into prefix."""
        directory = Path(directory).resolve()
        files = [(str(p.relative_to(directory)), p.stat().st_size, lambda p=p: p.open("rb"))
                 for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink()]
        return self.put_files(files, prefix)

    def open(self, prefix: str, rel: str):
        return self.fs.open(self._path(prefix, rel), "rb")

    def delete(self, prefix: str) -> None:
        target = self._path(prefix)
        if self.fs.exists(target):
            self.fs.rm(target, recursive=True)

    def local_path(self, prefix: str) -> Path | None:
        """The directory on this machine, where the store is local (the worker loads from it)."""
        return Path(self._path(prefix)) if self.is_local else None

    def fetch_directory(self, prefix: str, directory: Path) -> Path:
        """A local copy of a stored directory (for stores that are not on this machine)."""
        self.fs.get(self._path(prefix) + "/", str(directory), recursive=True)
        return directory
