"""A Python client of the Lethe service: what a data-governance system calls instead of hand-written HTTP.

    from lethe.client import Client
    client = Client()                                  # LETHE_URL, LETHE_API_KEY (or a config file)
    job = client.submit("mdl_...", read_records("people.jsonl"), request_id="dsar-17")
    job = client.follow(job.id, on_progress=print)     # server-sent events until the job ends
    client.download(job.model_id, job.result.model_version, "out/")   # resumable, sha256-verified

Errors are LetheError (the service's problem+json: status, type, detail, the fields at fault) or
VerificationError (a download that does not match its manifest)."""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from lethe.client.types import Job, ManifestFile, Model, Version

DEFAULT_URL = "http://127.0.0.1:8000"
CHUNK = 1 << 20
# The event stream sends a keep-alive every 15 s: a connection silent for longer is dead.
STREAM_TIMEOUT = httpx.Timeout(10.0, read=45.0)


class LetheError(Exception):
    """An answer of the service that is not a success: its problem+json, or a connection that failed
    (status 0)."""

    def __init__(self, status: int, title: str, detail: str | None = None, kind: str | None = None,
                 errors: list[dict] | None = None):
        super().__init__(f"{status} {title}" + (f": {detail}" if detail else ""))
        self.status, self.title, self.detail, self.kind, self.errors = status, title, detail, kind, errors or []


class VerificationError(Exception):
    """A downloaded file whose size or sha256 is not the manifest's."""


def config_file() -> Path:
    return Path(os.environ.get("LETHE_CONFIG") or Path.home() / ".config" / "lethe" / "config.json")


def settings() -> tuple[str, str | None]:
    """The server and the key: LETHE_URL and LETHE_API_KEY, else the config file ({"url", "api_key"}), else the
    embedded default (http://127.0.0.1:8000 and the key `make run` wrote to .lethe/admin_key here)."""
    stored: dict = {}
    if config_file().is_file():
        try:
            stored = json.loads(config_file().read_text())
        except ValueError:
            raise LetheError(400, "Bad config file", f"{config_file()} is not JSON") from None
    url = os.environ.get("LETHE_URL") or stored.get("url") or DEFAULT_URL
    key = os.environ.get("LETHE_API_KEY") or stored.get("api_key")
    embedded = Path(".lethe/admin_key")
    local = urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")
    if key is None and local and embedded.is_file():  # the local `make run`'s key goes to a local server only
        key = embedded.read_text().strip()
    return url.rstrip("/"), key


def idempotency_key(request_id: str) -> str:
    """Derived from the request id, so that submitting the same request twice creates one job (and the same id with
    other records is refused)."""
    return "lethe-" + hashlib.sha256(request_id.encode()).hexdigest()[:32]


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 60,
                 http: httpx.Client | None = None):
        found_url, found_key = settings()
        self.url, key = url or found_url, api_key or found_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = http or httpx.Client(base_url=self.url, timeout=timeout)
        self.http.headers.update(headers)

    # --- plumbing -----------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            answer = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise LetheError(0, "Cannot reach the service", f"{self.url}: {exc}") from None
        if answer.status_code >= 400:
            raise _problem(answer)
        return answer

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._call(method, path, **kwargs).json()

    def _pages(self, path: str, **params: Any) -> Iterator[dict]:
        token = None
        while True:
            page = self._json("GET", path, params={k: v for k, v in {**params, "page_token": token}.items()
                                                   if v is not None})
            yield from page["items"]
            token = page.get("next_page_token")
            if not token:
                return

    # --- models and versions ------------------------------------------------------------------------------

    def register_model(self, name: str, source: str, *, retain: list[dict] | None = None,
                       description: str | None = None, format: str = "plain",
                       retire_predecessors: bool = False, utility: list[dict] | None = None) -> Model:
        """`utility`: records no erasure trains on, which every erasure's audit measures before and after."""
        body = {"name": name, "source": source, "retain": retain, "description": description, "format": format,
                "retire_predecessors": retire_predecessors, "utility": utility}
        return Model.model_validate(self._json("POST", "/v1/models", json={k: v for k, v in body.items()
                                                                            if v is not None},
                                               headers={"Idempotency-Key": idempotency_key("model:" + name)}))

    def models(self) -> list[Model]:
        return [Model.model_validate(m) for m in self._pages("/v1/models")]

    def model(self, model: str) -> Model:
        """A model by id, or by name when no id matches."""
        if model.startswith("mdl_"):
            return Model.model_validate(self._json("GET", f"/v1/models/{model}"))
        named = [m for m in self.models() if m.name == model]
        if not named:
            raise LetheError(404, "Not found", f"no model with id or name {model!r}", "not-found")
        return named[0]

    def versions(self, model_id: str) -> list[Version]:
        return [Version.model_validate(v) for v in self._pages(f"/v1/models/{model_id}/versions")]

    def version(self, model_id: str, number: int | str = "latest") -> Version:
        return Version.model_validate(self._json("GET", f"/v1/models/{model_id}/versions/{number}"))

    def update_model(self, model_id: str, *, retire_predecessors: bool | None = None,
                     utility: list[dict] | None = None) -> Model:
        """Change what is given: retire_predecessors, the utility set ([] removes it)."""
        body = {"retire_predecessors": retire_predecessors, "utility": utility}
        return Model.model_validate(self._json("PATCH", f"/v1/models/{model_id}",
                                               json={k: v for k, v in body.items() if v is not None}))

    def retire(self, model_id: str, number: int) -> Version:
        """Stop serving a version (downloads answer 410); its files stay stored. Not the head."""
        return Version.model_validate(self._json("POST", f"/v1/models/{model_id}/versions/{number}:retire"))

    def purge(self, model_id: str, number: int) -> Version:
        """Delete a version's files; its manifest, lineage and audit stay. Not the head; cannot be undone."""
        return Version.model_validate(self._json("POST", f"/v1/models/{model_id}/versions/{number}:purge"))

    def manifest(self, model_id: str, number: int | str) -> list[ManifestFile]:
        files = self._json("GET", f"/v1/models/{model_id}/versions/{number}/files")["files"]
        return [ManifestFile.model_validate(f) for f in files]

    # --- jobs ---------------------------------------------------------------------------------------------

    def submit(self, model_id: str, forget: list[dict], *, request_id: str, retain: list[dict] | None = None,
               holdout: list[dict] | None = None, method: str = "masc", preset: str | None = None,
               params: dict | None = None, subjects: list[str] | None = None, format: str | None = None,
               audit: dict | None = None, mcu: dict | None = None, version: int | None = None) -> Job:
        """A deletion request; the Idempotency-Key comes from the request id."""
        body = {"model_id": model_id, "request_id": request_id, "forget": forget, "retain": retain,
                "holdout": holdout, "method": method, "preset": preset, "params": params, "subjects": subjects,
                "format": format, "audit": audit, "mcu": mcu, "version": version}
        return Job.model_validate(self._json("POST", "/v1/unlearning-jobs",
                                             json={k: v for k, v in body.items() if v is not None},
                                             headers={"Idempotency-Key": idempotency_key(request_id)}))

    def job(self, job_id: str) -> Job:
        return Job.model_validate(self._json("GET", f"/v1/unlearning-jobs/{job_id}"))

    def jobs(self, state: str | None = None, model_id: str | None = None) -> list[Job]:
        return [Job.model_validate(j) for j in self._pages("/v1/unlearning-jobs", state=state, model_id=model_id)]

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._json("POST", f"/v1/unlearning-jobs/{job_id}:cancel"))

    def result(self, job_id: str) -> dict:
        return self._json("GET", f"/v1/unlearning-jobs/{job_id}/result")

    def report(self, job_id: str) -> dict:
        return self._json("GET", f"/v1/unlearning-jobs/{job_id}/report")

    def report_html(self, job_id: str) -> str:
        return self._call("GET", f"/v1/unlearning-jobs/{job_id}/report.html").text

    def events(self, job_id: str) -> Iterator[tuple[str, dict]]:
        """The job's server-sent events, (name, data), until the stream ends (a terminal state's event last)."""
        try:
            with self.http.stream("GET", f"/v1/unlearning-jobs/{job_id}/events", timeout=STREAM_TIMEOUT) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    raise _problem(answer)
                name, data = None, []
                for line in answer.iter_lines():
                    if line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif not line and name is not None:
                        yield name, json.loads("\n".join(data))
                        name, data = None, []
        except httpx.TransportError as exc:
            raise LetheError(0, "Event stream broken", str(exc)) from None

    def follow(self, job_id: str, on_progress: Callable[[Job], None] | None = None, *, poll: float = 1.0,
               timeout: float | None = None) -> Job:
        """Wait for the job to end, calling `on_progress` with each new state or progress; the event stream, and
        polling where the stream breaks."""
        deadline = time.monotonic() + timeout if timeout else None

        def expired() -> bool:
            return deadline is not None and time.monotonic() > deadline

        job = self.job(job_id)
        while not job.ended:
            try:
                for name, data in self.events(job_id):
                    if name == "state":
                        job = Job.model_validate(data)
                    elif name == "progress":
                        job = job.model_copy(update={"progress": job.progress.model_validate(data)})
                    if on_progress is not None:
                        on_progress(job)
                    if job.ended or expired():
                        break
                job = self.job(job_id)
            except LetheError as exc:
                if exc.status != 0:
                    raise
                time.sleep(poll)  # the stream broke or the service restarts: ask again, then listen again
            if expired() and not job.ended:
                raise LetheError(0, "Timed out", f"job {job_id} is still {job.state}")
        if on_progress is not None:
            on_progress(job)
        return job

    # --- downloads ----------------------------------------------------------------------------------------

    def download(self, model_id: str, number: int | str, directory: str | Path,
                 on_bytes: Callable[[int], None] | None = None) -> dict:
        """Every file of a version into `directory`, each verified against the manifest's size and sha256. A file
        already there and whole is kept; a partial one (`.part`) is resumed with a Range request. Returns
        {"files", "bytes_fetched", "resumed", "kept"}."""
        directory = Path(directory)
        files = self.manifest(model_id, number)
        summary = {"files": len(files), "bytes_fetched": 0, "resumed": 0, "kept": 0}
        for entry in files:
            target = directory / entry.path
            if target.is_file() and _matches(target, entry):
                summary["kept"] += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            partial.touch()  # an empty file in the manifest has nothing to fetch
            have = partial.stat().st_size if partial.is_file() else 0
            if have > entry.size:
                partial.unlink()
                have = 0
            if have < entry.size:
                headers = {"Range": f"bytes={have}-"} if have else {}
                summary["resumed"] += bool(have)
                url = f"/v1/models/{model_id}/versions/{number}/files/{quote(entry.path)}"
                try:
                    with self.http.stream("GET", url, headers=headers) as answer:
                        if answer.status_code >= 400:
                            answer.read()
                            raise _problem(answer)
                        mode = "ab" if have and answer.status_code == 206 else "wb"
                        with partial.open(mode) as out:
                            for chunk in answer.iter_bytes(CHUNK):
                                out.write(chunk)
                                summary["bytes_fetched"] += len(chunk)
                                if on_bytes is not None:
                                    on_bytes(len(chunk))
                except httpx.TransportError as exc:
                    raise LetheError(0, "Download broken", f"{entry.path}: {exc} (run again to resume)") from None
            if not _matches(partial, entry):
                partial.unlink()
                raise VerificationError(f"{entry.path}: the bytes received do not match the manifest's sha256")
            partial.replace(target)
        return summary

    # --- audit and subjects -------------------------------------------------------------------------------

    def verify_audit_log(self, checkpoints: list[dict] | None = None) -> dict:
        """The chain's check; with checkpoints kept from reports, also that none was cut back or rewritten."""
        if checkpoints:
            return self._json("POST", "/v1/audit-log/verify", json={"checkpoints": checkpoints})
        return self._json("GET", "/v1/audit-log/verify")

    def subject(self, subject: str) -> dict:
        """Asked in the body, so that the id stays out of URLs and access logs (and may hold any character)."""
        return self._json("POST", "/v1/subjects:lookup", json={"subject": subject})


def _problem(answer: httpx.Response) -> LetheError:
    try:
        body = answer.json()
    except ValueError:
        body = {}
    kind = str(body.get("type", "")).rsplit("/", 1)[-1] or None
    return LetheError(answer.status_code, body.get("title") or answer.reason_phrase, body.get("detail"), kind,
                      body.get("errors"))


def _matches(path: Path, entry: ManifestFile) -> bool:
    if path.stat().st_size != entry.size:
        return False
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest() == entry.sha256
