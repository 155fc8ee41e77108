"""A model's files are data, never directions (issue 26). A checkpoint's JSON can make from_pretrained read
weights from anywhere the worker can read (a shard index naming `/other/model.safetensors` or
`../x.safetensors`), run code (`auto_map`, `custom_pipelines`), load another model (an adapter's
`base_model_name_or_path`) or fetch from the Hub. Checked at registration and again before every load: each file
a JSON names is a plain relative name of a file in the folder, and nothing names code or another model.
Torch-free: the API runs it on the files it is about to copy."""
from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterable
from pathlib import Path

from lethe.engine.contract.errors import EngineInputError

# The JSON files whose keys from_pretrained turns into loading decisions (config, tokenizer and processor
# kwargs, generation defaults). tokenizer.json and vocab.json hold a vocabulary, never a path.
CONFIG_FILES = ("config.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                "preprocessor_config.json", "processor_config.json", "feature_extractor_config.json",
                "image_processor_config.json", "chat_template.json")
# Keys that name code to import or a pipeline class: never honoured (no trust_remote_code), refused so a model
# that needs them says so at registration instead of loading as something else.
CODE_KEYS = ("auto_map", "custom_pipelines")
MAX_CONFIG_BYTES = 16 * 2**20  # a config past this is not a config; its parse would cost the API the memory
# A safetensors header (its JSON table of tensors) past this is refused: a real one is kilobytes (a 70B model's
# largest shard names about a thousand tensors); safetensors' own limit, 100 MB, is memory every read would cost.
MAX_HEADER_BYTES = 16 * 2**20


def plain_name(value: object) -> bool:
    """A relative POSIX name inside the folder: no root, no drive, no `..` or `.` step, no backslash or NUL."""
    if not isinstance(value, str) or not value or "\\" in value or "\x00" in value or value.startswith("/"):
        return False
    if len(value) > 1 and value[1] == ":":  # C:... on a Windows-made config
        return False
    return all(part not in ("", ".", "..") for part in value.split("/")) and posixpath.normpath(value) == value


def check_model_files(names: Iterable[str], read: Callable[[str, int], bytes], field: str = "model") -> None:
    """Refuse a checkpoint whose JSON points outside its own files, or whose safetensors headers are past
    MAX_HEADER_BYTES. `names`: every file's relative name; `read(name, limit)`: its first `limit` bytes (only JSON
    configs, shard indexes and the 8-byte length of each safetensors header are read). Raises EngineInputError
    naming the file and key."""
    files = set(names)
    for name in sorted(files):
        base = posixpath.basename(name)
        if base.endswith(".safetensors"):
            _check_header_length(name, read(name, 8), field)
        elif base == "adapter_config.json":
            _refuse_adapter(name, read, field)
        elif base.endswith(".index.json"):
            _check_index(name, _load(name, read, field), files, field)
        elif base in CONFIG_FILES:
            _check_config(name, _load(name, read, field), files, field)


def check_model_folder(directory: str | Path, field: str = "model") -> None:
    """check_model_files on a folder on this machine (the worker, before from_pretrained reads it)."""
    root = Path(directory)
    names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]

    def read(name: str, limit: int) -> bytes:
        with (root / name).open("rb") as handle:
            return handle.read(limit)

    check_model_files(names, read, field)


def header_length(first_bytes: bytes) -> int | None:
    """A safetensors header's length from the file's first 8 bytes (None: too short to be one)."""
    return int.from_bytes(first_bytes[:8], "little") if len(first_bytes) >= 8 else None


def _check_header_length(name: str, first_bytes: bytes, field: str) -> None:
    length = header_length(first_bytes)
    if length is None or not 0 < length <= MAX_HEADER_BYTES:
        raise EngineInputError(f"{name}: a safetensors header of {length} bytes; a header holds 1 to "
                               f"{MAX_HEADER_BYTES} bytes (a table of tensors, not data)", field=field)


def _load(name: str, read: Callable[[str, int], bytes], field: str):
    data = read(name, MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise EngineInputError(f"{name}: {len(data)} bytes, more than a configuration file holds "
                               f"({MAX_CONFIG_BYTES})", field=field)
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise EngineInputError(f"{name}: not valid JSON", field=field) from None


def _check_index(name: str, index, files: set[str], field: str) -> None:
    """A shard index: every shard a plain name of a file beside the index (transformers joins the folder with
    whatever the index says, an absolute path or `../` included)."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise EngineInputError(f"{name}: no weight_map object", field=field)
    folder = posixpath.dirname(name)
    for tensor, shard in weight_map.items():
        if not plain_name(shard):
            raise EngineInputError(f"{name}, key weight_map[{tensor!r}]: shard {shard!r} is not a plain file name "
                                   "inside the model folder (no absolute path, no '..')", field=field)
        if posixpath.join(folder, shard) not in files:
            raise EngineInputError(f"{name}, key weight_map[{tensor!r}]: shard {shard!r} is not among the model's "
                                   "files", field=field)


def _check_config(name: str, config, files: set[str], field: str) -> None:
    for path, key, value in _items(config):
        if key in CODE_KEYS:
            raise EngineInputError(f"{name}, key {path}: names code to run ({key}); this service loads no remote "
                                   "or custom code: register a model of an architecture transformers ships",
                                   field=field)
        if key.endswith(("_file", "_files")):
            for named in value if isinstance(value, list) else [value]:
                if named is None:
                    continue
                if not plain_name(named) or posixpath.join(posixpath.dirname(name), named) not in files:
                    raise EngineInputError(f"{name}, key {path}: {named!r} is not the name of a file in the model "
                                           "folder; remove the key or name a file beside it", field=field)


def _items(config):
    """(dotted path, key, value) for every key of nested objects and lists; a stack, not recursion (a config may
    nest as deep as the JSON parser allows)."""
    stack: list[tuple[str, object]] = [("", config)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{prefix}.{key}" if prefix else str(key)
                yield path, str(key), value
                stack.append((path, value))
        elif isinstance(node, list):
            stack.extend((f"{prefix}[{i}]", value) for i, value in enumerate(node))


def _refuse_adapter(name: str, read: Callable[[str, int], bytes], field: str) -> None:
    """A PEFT adapter folder makes from_pretrained load another model (`base_model_name_or_path`, a path or a Hub
    id) and apply the adapter to it: a model is registered merged, as the model it is."""
    adapter = _load(name, read, field)
    key = "base_model_name_or_path" if isinstance(adapter, dict) and adapter.get("base_model_name_or_path") else None
    where = f"{name}, key {key}" if key else name
    raise EngineInputError(f"{where}: a PEFT adapter, whose loading reads another model; merge the adapter into its "
                           "base (peft's merge_and_unload, then save_pretrained) and register the merged model",
                           field=field)
