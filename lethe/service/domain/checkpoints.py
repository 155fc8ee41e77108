"""What the service checks of a stored checkpoint from its files, without loading it (the API stays torch-free):
that named LoRA targets exist, and that the tokenizer carries a chat template where the chat format is asked for.
Checked where the store is on this machine; elsewhere the worker finds the same faults on the loaded model."""
from __future__ import annotations

from pathlib import Path

from lethe.engine.contract.chat_format import checkpoint_has_chat_template
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.model.lora_targets import check_requested, checkpoint_inventory
from lethe.service.infra.artifacts import artifact_store
from lethe.service.settings import get_settings


def local_directory(location: str) -> Path | None:
    directory = artifact_store(get_settings()).local_path(location)
    return directory if directory is not None and directory.is_dir() else None


def check_targets(requested: list[str] | str, location: str) -> None:
    """Named LoRA targets must exist in the model: read from the checkpoint's safetensors headers."""
    if requested == "auto" or requested == ["auto"]:
        return  # chosen by rule on the loaded model: no header is read for it
    directory = local_directory(location)
    inventory = checkpoint_inventory(directory) if directory is not None else None
    if inventory is not None:
        try:
            check_requested(requested, *inventory)
        except EngineInputError as exc:
            raise EngineInputError(str(exc), field=f"params.{exc.field}") from None


def check_chat_template(format: str, location: str) -> None:
    """The chat format needs a tokenizer with a chat template."""
    directory = local_directory(location)
    if format == "chat" and directory is not None and not checkpoint_has_chat_template(directory):
        raise EngineInputError("format chat: the model's tokenizer has no chat template (tokenizer_config.json "
                               "names none); use the plain format or register a model whose tokenizer has one",
                               field="format")
