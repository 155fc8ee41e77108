"""`lethe models ...`: lineage roots and their versions."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lethe.client.cli_io import JsonFlag, answered, connect, dump, fail, out, records

models_app = typer.Typer(help="Models (lineage roots) and their versions.", no_args_is_help=True)


@models_app.command("list")
def models_list(as_json: JsonFlag = False) -> None:
    """The models you can see."""
    with answered():
        found = connect().models()
    out([dump(m) for m in found], as_json, "\n".join(
        f"{m.id}  {m.name}  latest v{m.latest_version}  {m.format}" for m in found))


@models_app.command("register")
def models_register(name: str, source: Annotated[str, typer.Argument(help="a folder under an import root, "
                                                                          "hf:org/name, or s3://...")],
                    retain: Annotated[Path | None, typer.Option(help="the model's retain records")] = None,
                    utility: Annotated[Path | None, typer.Option(
                        help="records no erasure trains on, measured by every erasure's audit")] = None,
                    format: Annotated[str, typer.Option(help="plain or chat (its tokenizer's template)")] = "plain",
                    description: Annotated[str | None, typer.Option()] = None, as_json: JsonFlag = False) -> None:
    """Register a lineage root: its files become version 1."""
    with answered():
        model = connect().register_model(name, source, retain=records(retain), description=description,
                                        format=format, utility=records(utility))
    out(dump(model), as_json, f"{model.id}  {model.name}")


@models_app.command("versions")
def models_versions(model: str, as_json: JsonFlag = False) -> None:
    """A model's versions: lineage, erasures held, tags."""
    client = connect()
    with answered():
        found = client.versions(client.model(model).id)
    out([dump(v) for v in found], as_json, "\n".join(
        f"v{v.number}  parent {v.parent}  erased {len(v.erased_request_ids)}  {v.state}  {' '.join(v.tags)}"
        for v in found))


@models_app.command("retire")
def models_retire(model: str, version: int, as_json: JsonFlag = False) -> None:
    """Stop serving a version: its downloads answer 410 Gone; files, lineage and audit stay. Not the head."""
    client = connect()
    with answered():
        found = client.retire(client.model(model).id, version)
    out(dump(found), as_json, f"v{found.number}  {found.state}  retired at {found.retired_at}")


@models_app.command("purge")
def models_purge(model: str, version: int,
                 yes: Annotated[bool, typer.Option("--yes", help="confirm: the files cannot be brought back")] = False,
                 as_json: JsonFlag = False) -> None:
    """Delete a version's files (its manifest of sha256 hashes, lineage and audit stay). Not the head."""
    if not yes:
        raise fail("purge deletes the version's files for good: add --yes to confirm", 2)
    client = connect()
    with answered():
        found = client.purge(client.model(model).id, version)
    out(dump(found), as_json, f"v{found.number}  {found.state}  purged at {found.purged_at}")


@models_app.command("settings")
def models_settings(model: str, retire_predecessors: Annotated[bool | None, typer.Option(
        "--retire-predecessors/--keep-predecessors",
        help="once an erasure succeeds, retire the served versions that lack it")] = None,
        utility: Annotated[Path | None, typer.Option(
            help="records in place of its utility set (an empty file removes it)")] = None,
        as_json: JsonFlag = False) -> None:
    """Change a model's settings: what is given changes, the rest stays."""
    client = connect()
    with answered():
        found = client.update_model(client.model(model).id, retire_predecessors=retire_predecessors,
                                    utility=records(utility) if utility else None)
    out(dump(found), as_json, f"{found.name}: retire_predecessors={found.retire_predecessors} "
                              f"utility_count={found.utility_count}")
