"""Issue 26, item 1: a model's files are data, never directions. Each vector is tried against the real loader
(transformers' from_pretrained through the engine): refused with an error naming the file and the key."""
import http.server
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.model_files import check_model_files, plain_name
from lethe.engine.data.synthetic import synthetic_people
from lethe.engine.model.fixture import FixtureConfig, build_model, train_tokenizer
from lethe.engine.model.loading import load_config, load_model, load_tokenizer, load_weights, save_model

ROOT = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny random models: the tenant's own, and another's it must not reach."""
    records = [r for p in synthetic_people(2, seed=0) for r in p]
    tokenizer = train_tokenizer(records, 256)
    cfg = FixtureConfig(seed=0, epochs=1, vocab_size=256, hidden_size=32, layers=1, heads=2)
    out = tmp_path_factory.mktemp("models")
    for name, seed in (("other", 1), ("own", 2)):
        torch.manual_seed(seed)
        save_model(build_model(tokenizer, cfg), tokenizer, out / name)
    return out / "own", out / "other"


def variant(own: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "variant"
    shutil.copytree(own, copy)
    return copy


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(changes)
    path.write_text(json.dumps(data))


def index_to(folder: Path, shard: str, other: Path) -> None:
    """Replace the folder's weights with a shard index naming `shard` for every tensor."""
    with safe_open(str(other / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {n: shard for n in names}}))


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("form", ["absolute", "parent"])
def test_a_shard_index_naming_another_models_weights_is_refused(models, tmp_path, form):
    own, other = models
    folder = variant(own, tmp_path)
    target = other / "model.safetensors"
    shard = str(target) if form == "absolute" else os.path.relpath(target, folder)
    index_to(folder, shard, other)
    refusal = r"model.safetensors.index.json, key weight_map\[.*not a plain file name"
    with pytest.raises(EngineInputError, match=refusal):
        load_weights(folder, CPU)


def test_a_shard_index_of_plain_names_in_the_folder_loads(models, tmp_path):
    own, _ = models
    model, tokenizer = load_model(own, CPU)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="20KB")
    tokenizer.save_pretrained(sharded)
    assert (sharded / "model.safetensors.index.json").exists()
    assert same_weights(load_weights(sharded, CPU), model)
    # A shard the index names that the folder lacks is refused by name, not looked for elsewhere.
    next(sharded.glob("model-00001-*.safetensors")).unlink()
    with pytest.raises(EngineInputError, match="is not among the model's files"):
        load_weights(sharded, CPU)


@pytest.mark.parametrize("file,key", [("config.json", "auto_map"), ("tokenizer_config.json", "auto_map"),
                                      ("config.json", "custom_pipelines")])
def test_keys_that_name_code_are_refused(models, tmp_path, file, key):
    folder = variant(models[0], tmp_path)
    edit_json(folder / file, **{key: {"AutoModelForCausalLM": "someone/repo--modeling.Evil"}})
    loader = load_config if file == "config.json" else load_tokenizer
    with pytest.raises(EngineInputError, match=rf"{file}, key {key}: names code to run"):
        loader(folder)


def test_a_code_key_nested_in_a_sub_config_is_found(models, tmp_path):
    folder = variant(models[0], tmp_path)
    edit_json(folder / "config.json", text_config={"auto_map": {"AutoConfig": "x--y.Z"}})
    with pytest.raises(EngineInputError, match=r"config.json, key text_config.auto_map"):
        load_weights(folder, CPU)


@pytest.mark.parametrize("value", ["/etc/hostname", "../other/tokenizer.json", "C:/tokenizer.json", "missing.json"])
def test_a_file_key_naming_anything_but_a_file_in_the_folder_is_refused(models, tmp_path, value):
    folder = variant(models[0], tmp_path)
    edit_json(folder / "tokenizer_config.json", tokenizer_file=value)
    refusal = r"tokenizer_config.json, key tokenizer_file: .* is not the name of a file"
    with pytest.raises(EngineInputError, match=refusal):
        load_tokenizer(folder)
    # The same key naming the folder's own file (as older transformers wrote it) loads.
    edit_json(folder / "tokenizer_config.json", tokenizer_file="tokenizer.json")
    assert load_tokenizer(folder).eos_token_id is not None


def test_an_adapter_folder_naming_its_base_is_refused_before_any_fetch(models, tmp_path):
    folder = variant(models[0], tmp_path)
    edit_json(folder / "adapter_config.json", base_model_name_or_path=str(models[1]), peft_type="LORA")
    with pytest.raises(EngineInputError, match=r"adapter_config.json, key base_model_name_or_path: a PEFT adapter"):
        load_weights(folder, CPU)
    (folder / "config.json").unlink()  # transformers would now load the named base in its place
    with pytest.raises(EngineInputError, match="adapter_config.json"):
        load_weights(folder, CPU)


def test_plain_name_against_a_brute_force_resolution(tmp_path):
    """plain_name accepts exactly the names that stay inside the folder as written (no normalisation needed)."""
    inside = tmp_path / "m"
    inside.mkdir()
    parts = ["a", "b.json", ".", "..", "", "x..y", ".hidden"]
    names = {"/".join(p) for p in itertools.product(parts, repeat=2)} | {"/abs", "a\\b", "C:x", "a\x00"}
    for name in names:
        stays = (not name.startswith("/") and "\\" not in name and "\x00" not in name and ":" not in name
                 and name.split("/") == [p for p in name.split("/") if p not in ("", ".", "..")]
                 and (inside / name).resolve().is_relative_to(inside.resolve()))
        assert plain_name(name) == stays, name


def test_configs_past_the_size_cap_and_broken_json_are_refused_not_parsed():
    big = b"{" + b" " * (16 * 2**20) + b"}"
    with pytest.raises(EngineInputError, match="more than a configuration file holds"):
        check_model_files(["config.json"], lambda _, limit: big[:limit])
    with pytest.raises(EngineInputError, match="not valid JSON"):
        check_model_files(["tokenizer_config.json"], lambda _, limit: (b"[" * 100_000)[:limit])


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self):  # noqa: N802
        Recorder.seen.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *_):
        pass


def test_the_worker_never_asks_the_hub(tmp_path):
    """In the worker process (its module sets the Hub offline before transformers loads), a model named by Hub id
    is not fetched: a stand-in Hub on localhost sees no request."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    code = ("import lethe.worker.celery_app\n"
            "from lethe.engine.model.loading import load_tokenizer\n"
            "from lethe.engine.contract.errors import EngineInputError\n"
            "try:\n    load_tokenizer('someone/some-model')\nexcept EngineInputError as e:\n    print('refused', e)\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
           "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
    finally:
        server.shutdown()
    assert "refused" in done.stdout, done.stdout + done.stderr
    assert Recorder.seen == []


def test_a_safetensors_header_past_the_cap_is_refused_by_the_loader(models, tmp_path):
    folder = variant(models[0], tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes((17 * 2**20).to_bytes(8, "little") + weights.read_bytes()[8:])
    with pytest.raises(EngineInputError, match="model.safetensors: a safetensors header of 17825792 bytes"):
        load_weights(folder, CPU)
