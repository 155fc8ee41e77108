"""What every `lethe` command shares: exit codes, error lines, output, reading the files it is given."""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from lethe.client import Client, LetheError, VerificationError
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import read_records

OK, JOB_ENDED_BADLY, REFUSED, UNREACHABLE, UNVERIFIED, NOT_FORGOTTEN = 0, 1, 2, 3, 4, 5

err = Console(stderr=True, soft_wrap=True)  # messages are not cut into lines

JsonFlag = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout, for scripts")]


def fail(message: str, code: int) -> typer.Exit:
    err.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)


@contextmanager
def answered() -> Iterator[None]:
    """The service's refusals and failures, and failed verifications, as one line and an exit code."""
    try:
        yield
    except LetheError as exc:
        raise fail(str(exc), REFUSED if 400 <= exc.status < 500 else UNREACHABLE) from None
    except VerificationError as exc:
        raise fail(str(exc), UNVERIFIED) from None


def connect() -> Client:
    with answered():
        return Client()


def out(value: Any, as_json: bool, human: str | None = None) -> None:
    if as_json:
        print(json.dumps(value, indent=2, default=str))
    elif human is not None:
        print(human)


def dump(model: Any) -> Any:
    return model.model_dump(mode="json") if hasattr(model, "model_dump") else model


def records(path: Path | None) -> list[dict] | None:
    if path is None:
        return None
    try:
        return read_records(path)
    except (EngineInputError, OSError) as exc:
        raise fail(str(exc), REFUSED) from None


def read_json(path: Path | None, what: str) -> Any:
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise fail(f"{what} {path}: {exc}", REFUSED) from None
