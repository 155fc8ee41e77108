"""The artifact store: model directories under a local root or any fsspec URI (s3://...), with a
manifest of every file's size and sha256 computed while it is copied in."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fsspec

CHUNK = 1 << 20
STREAM_CHUNK = 8 << 20  # downloads: fewer hops through the thread pool per byte


def manifest_sha256(manifest: list[dict]) -> str:
    canonical = json.dumps(sorted(manifest, key=lambda e: e["path"]), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class ArtifactStore:
    def __init__(self, root: str):
        self.fs, self.root = fsspec.core.url_to_fs(root)
        self.is_local = "file" in self.fs.protocol
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def _path(self, prefix: str, rel: str = "") -> str:
        return "/".join([self.root.rstrip("/"), prefix.strip("/")] + ([rel.lstrip("/")] if rel else []))

    def put_directory(self, source_fs, source_root: str, prefix: str) -> list[dict]:
        """Copy every file below source_root into prefix; returns the manifest."""
        manifest = []
        files = sorted(p for p in source_fs.find(source_root) if source_fs.isfile(p))
        for path in files:
            rel = str(Path(path).relative_to(source_root)) if source_root else path
            digest, size = hashlib.sha256(), 0
            target = self._path(prefix, rel)
            self.fs.makedirs(str(Path(target).parent), exist_ok=True)
            with source_fs.open(path, "rb") as src, self.fs.open(target, "wb") as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    dst.write(chunk)
            manifest.append({"path": rel, "size": size, "sha256": digest.hexdigest()})
        return manifest

    def put_local_directory(self, directory: Path, prefix: str) -> list[dict]:
        return self.put_directory(fsspec.filesystem("file"), str(Path(directory).resolve()), prefix)

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
