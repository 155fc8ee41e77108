"""`lethe`: the service from the command line, for the system that sends deletion requests.

    lethe erase --model demo --forget people.jsonl --wait --download out/

The server is LETHE_URL (default http://127.0.0.1:8000), the key LETHE_API_KEY, else the config file
(LETHE_CONFIG, default ~/.config/lethe/config.json: {"url": ..., "api_key": ...}), else the key `make run` wrote to
.lethe/admin_key in this folder. Every command takes --json for scripts. Exit codes: 0 done; 1 the job ended
FAILED or CANCELLED; 2 bad usage, or input the service refused (4xx); 3 the service unreachable or failing (5xx);
4 a verification failed (a download's sha256, the audit log's chain); 5 the verdict is not "Forgotten" (with
--require-forgotten)."""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
import webbrowser
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from lethe.client import Client
from lethe.client.cli_io import (
    JOB_ENDED_BADLY,
    NOT_FORGOTTEN,
    OK,
    REFUSED,
    UNVERIFIED,
    JsonFlag,
    answered,
    connect,
    dump,
    err,
    fail,
    out,
    read_json,
    records,
)
from lethe.client.cli_models import models_app
from lethe.client.types import Job

HELP = ("The Lethe service from the command line: submit deletion requests, follow them, fetch verified checkpoints "
        "and audit reports.\n\n"
        "Example: lethe erase --model demo --forget people.jsonl --wait --download out/\n\n"
        "The server is LETHE_URL (default http://127.0.0.1:8000) and the key LETHE_API_KEY; else the config file "
        "LETHE_CONFIG (default ~/.config/lethe/config.json, {\"url\": ..., \"api_key\": ...}); else the key `make "
        "run` wrote to .lethe/admin_key in this folder. Every command takes --json for scripts.\n\n"
        "Exit codes: 0 done; 1 the job ended FAILED or CANCELLED; 2 bad usage, or input the service refused (4xx); "
        "3 the service unreachable or failing (5xx); 4 a verification failed (a download's sha256, the audit log's "
        "chain); 5 the verdict is not Forgotten (with --require-forgotten).")
app = typer.Typer(help=HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(models_app, name="models")


def parse_params(pairs: list[str], params_file: Path | None) -> dict | None:
    """key=value pairs (values read as JSON where they parse: numbers, true, "auto", lists) over a JSON file."""
    params: dict = read_json(params_file, "--params-file") or {}
    for pair in pairs:
        if "=" not in pair:
            raise fail(f"--param {pair!r}: expected key=value", REFUSED)
        key, value = pair.split("=", 1)
        try:
            params[key.strip()] = json.loads(value)
        except ValueError:
            params[key.strip()] = value
    return params or None


class Watcher:
    """The job's progress on stderr: a bar in a terminal (steps, V against alpha, time left), plain lines
    elsewhere (at most one a second)."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.live = enabled, err.is_terminal
        self.bar: Progress | None = None
        self.task: Any = None
        self.last: tuple[str | None, int | None, float] = (None, None, 0.0)

    def __enter__(self) -> Watcher:
        if self.enabled and self.live:
            self.bar = Progress(TextColumn("[bold]{task.fields[state]}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("V {task.fields[v]} / alpha {task.fields[alpha]}"),
                                TimeRemainingColumn(), console=err, transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("job", total=None, state="QUEUED", v="-", alpha="-")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, job: Job) -> None:
        if not self.enabled:
            return
        p = job.progress
        v = "-" if p.violation_rate is None else f"{p.violation_rate:.3f}"
        alpha = "-" if p.alpha is None else f"{p.alpha:.3f}"
        if self.bar is not None:
            # max_steps is MASC's safety cap: a run the rule stopped early fills the bar at its last step.
            total = (p.step or 0) if job.ended and job.state == "SUCCEEDED" else p.max_steps
            self.bar.update(self.task, completed=p.step or 0, total=total, state=job.state, v=v, alpha=alpha)
            return
        now = time.monotonic()
        if (job.state, p.step) != self.last[:2] and (now - self.last[2] >= 1 or job.ended or job.state != self.last[0]):
            err.print(f"{job.state} step {p.step or 0}/{p.max_steps or '?'} V {v} alpha {alpha}", markup=False,
                      highlight=False)
            self.last = (job.state, p.step, now)


def follow(client: Client, job_id: str, quiet: bool) -> Job:
    with Watcher(enabled=not quiet) as watch:
        return client.follow(job_id, on_progress=watch)


def ended_code(job: Job) -> int:
    if job.state == "SUCCEEDED":
        return OK
    detail = (job.error or {}).get("detail") or job.state
    err.print(f"job {job.id} ended {job.state}: {detail}", markup=False, highlight=False)
    return JOB_ENDED_BADLY


def write_report(client: Client, job_id: str, path: Path, fetched: dict | None = None) -> None:
    """The page for a .html path, else the JSON (`fetched`: the report already in hand)."""
    if path.suffix.lower() in (".html", ".htm"):
        path.write_text(client.report_html(job_id))
    else:
        path.write_text(json.dumps(fetched or client.report(job_id), indent=2))


@app.command()
def erase(model: Annotated[str, typer.Option(help="the model's id or name")],
          forget: Annotated[Path, typer.Option(help="the records to erase: JSON, JSON Lines or CSV")],
          retain: Annotated[Path | None, typer.Option(help="records whose answers must be kept")] = None,
          holdout: Annotated[Path | None, typer.Option(help="records the model never saw (calibration, MIA)")] = None,
          request_id: Annotated[str | None, typer.Option(help="the erasure request's id (default: derived from "
                                                              "the forget file's contents)")] = None,
          method: Annotated[str, typer.Option(help="masc or a baseline (see the API's schema)")] = "masc",
          preset: Annotated[str | None, typer.Option(help="MASC's published or named values")] = None,
          param: Annotated[list[str], typer.Option("--param", help="a method parameter, key=value (repeat; "
                                                                   "`python -m lethe.engine unlearn --help` "
                                                                   "lists them)")] = [],  # noqa: B006
          params_file: Annotated[Path | None, typer.Option(help="method parameters as a JSON object")] = None,
          subject: Annotated[list[str], typer.Option("--subject", help="a data subject the request concerns "
                                                                       "(repeat)")] = [],  # noqa: B006
          format: Annotated[str | None, typer.Option(help="plain or chat (default: the model's)")] = None,
          version: Annotated[int | None, typer.Option(help="the version to start from (default: the head)")] = None,
          wait: Annotated[bool, typer.Option(help="follow the job to its end with a progress bar")] = False,
          download: Annotated[Path | None, typer.Option(help="then download the new version here (verified; "
                                                             "implies --wait)")] = None,
          report: Annotated[Path | None, typer.Option(help="then write the audit report here (.json, or .html "
                                                           "for the page; implies --wait)")] = None,
          require_forgotten: Annotated[bool, typer.Option(help="exit 5 unless the verdict is Forgotten")] = False,
          quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
          as_json: JsonFlag = False) -> None:
    """Submit a deletion request from a file; with --wait, follow it; with --download and --report, fetch the
    verified checkpoint and the evidence."""
    client = connect()
    forget_records = records(forget) or []
    with answered():
        target = client.model(model)
        # By default the request is this file for this model: sent twice, it is one job.
        rid = request_id or "lethe-" + hashlib.sha256(target.id.encode() + forget.read_bytes()).hexdigest()[:16]
        job = client.submit(target.id, forget_records, request_id=rid, retain=records(retain),
                            holdout=records(holdout), method=method, preset=preset,
                            params=parse_params(param, params_file), subjects=subject or None, format=format,
                            version=version)
        if not as_json:
            print(f"job {job.id} {job.state} (request {rid}, model {target.name} v{job.base_version})")
        summary: dict[str, Any] = {"job": None, "download": None, "report": None, "verdict": None}
        code = OK
        if wait or download or report or require_forgotten:
            job = follow(client, job.id, quiet or as_json)
            code = ended_code(job)
            if code == OK:
                assert job.result is not None and job.result.model_version is not None
                if download:
                    summary["download"] = {"directory": str(download), **client.download(
                        job.model_id, job.result.model_version, download)}
                    if not as_json:
                        print(f"version {job.result.model_version} in {download}: {summary['download']['files']} "
                              "files, sha256 verified")
                evidence = client.report(job.id)
                verdict = evidence["verdict"]
                # The per-record table stays in the report (--report): a summary line per channel here.
                summary["verdict"] = {k: verdict[k] for k in ("forgotten", "summary", "reasons", "evidence", "channels")
                                      if k in verdict}
                if report:
                    write_report(client, job.id, report, evidence)
                    summary["report"] = str(report)
                if not as_json:
                    print(verdict["summary"])
                if require_forgotten and not verdict["forgotten"]:
                    code = NOT_FORGOTTEN
        summary["job"] = dump(job)
        out(summary, as_json)
    raise typer.Exit(code)


@app.command("follow")
def follow_job(job_id: str, quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
               as_json: JsonFlag = False) -> None:
    """Follow a job to its end (server-sent events); the exit code says how it ended."""
    client = connect()
    with answered():
        job = follow(client, job_id, quiet or as_json)
    out(dump(job), as_json, f"job {job.id} {job.state}")
    raise typer.Exit(ended_code(job))


@app.command()
def jobs(state: Annotated[str | None, typer.Option(help="only jobs in this state")] = None,
         model: Annotated[str | None, typer.Option(help="only this model's jobs (id or name)")] = None,
         as_json: JsonFlag = False) -> None:
    """List jobs, newest first."""
    client = connect()
    with answered():
        model_id = client.model(model).id if model else None
        found = client.jobs(state=state, model_id=model_id)
    out([dump(j) for j in found], as_json, "\n".join(
        f"{j.id}  {j.state:<10} {j.method:<8} {j.request_id}  step {j.progress.step or 0}" for j in found))


@app.command()
def job(job_id: str, as_json: JsonFlag = False) -> None:
    """One job: state, progress, result or error."""
    with answered():
        found = connect().job(job_id)
    out(dump(found), as_json, json.dumps(dump(found), indent=2))


@app.command()
def cancel(job_id: str, as_json: JsonFlag = False) -> None:
    """Cancel a job (a running one stops at its next step)."""
    with answered():
        found = connect().cancel(job_id)
    out(dump(found), as_json, f"job {found.id} {found.state}")


@app.command("report")
def show_report(job_id: str,
                html: Annotated[bool, typer.Option(help="the page for people instead of JSON")] = False,
                out_file: Annotated[Path | None, typer.Option("--out", help="write it here")] = None,
                open_page: Annotated[bool, typer.Option("--open", help="open the page in a browser")] = False) -> None:
    """A job's audit report: the verdict and the evidence."""
    client = connect()
    with answered():
        if open_page:
            path = out_file or Path(tempfile.mkdtemp(prefix="lethe-")) / f"{job_id}.html"
            path.write_text(client.report_html(job_id))
            webbrowser.open(path.resolve().as_uri())
            print(path)
        elif out_file:
            write_report(client, job_id, out_file if not html or out_file.suffix else out_file.with_suffix(".html"))
        else:
            print(client.report_html(job_id) if html else json.dumps(client.report(job_id), indent=2))


@app.command("download")
def download_version(model: Annotated[str, typer.Argument(help="the model's id or name")],
                     directory: Annotated[Path, typer.Argument(help="where the checkpoint goes")],
                     version: Annotated[str, typer.Option(help="a version number, or latest (the head)")] = "latest",
                     as_json: JsonFlag = False) -> None:
    """Download a version (resuming partial files with Range requests), every file checked against the manifest's
    sha256."""
    client = connect()
    with answered():
        target = client.model(model)
        number = client.version(target.id, version).number
        summary = client.download(target.id, number, directory)
    out({"model_id": target.id, "version": number, **summary}, as_json,
        f"{target.name} v{number} in {directory}: {summary['files']} files verified ({summary['kept']} kept, "
        f"{summary['resumed']} resumed)")


@app.command("audit-verify")
def audit_verify(checkpoints: Annotated[Path | None, typer.Option(help="a JSON list of signed checkpoints kept "
                                                                       "from reports")] = None,
                 as_json: JsonFlag = False) -> None:
    """Check the audit log's hash chain, and that no checkpoint you kept was cut back or rewritten (exit 4 if
    one was)."""
    with answered():
        kept = read_json(checkpoints, "--checkpoints")
        result = connect().verify_audit_log(kept)
    out(result, as_json, ("chain intact" if result["ok"] else f"BROKEN at entry {result['broken_at']}: "
                          f"{result['reason']}") + f" ({result['entries']} of your entries)")
    raise typer.Exit(OK if result["ok"] else UNVERIFIED)


@app.command()
def subject(subject_id: str, as_json: JsonFlag = False) -> None:
    """What was erased of a data subject: its requests, and per model the versions that predate the erasure."""
    with answered():
        found = connect().subject(subject_id)
    lines = [f"{r['request_id']}: {r['state']}" + (f", version {r['version']}" if r["version"] else "")
             for r in found["requests"]]
    lines += [f"model {m['name']}: erased={m['erased']}, stop serving versions {m['versions_predating_erasure']}"
              f" (retired {m.get('versions_predating_retired', [])}, purged {m.get('versions_predating_purged', [])})"
              for m in found["models"]]
    out(found, as_json, "\n".join(lines) or f"no request named {subject_id!r}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
