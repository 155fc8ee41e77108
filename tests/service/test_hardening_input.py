"""Issue 12, what an attacker found: model sources that read or write where they must not, and input that
crashed the service. Every case answers 4xx problem+json and changes nothing."""
import base64
import json
import os
import shutil
import threading
import uuid

import pytest
from sqlalchemy import func, select

from lethe.service.infra.artifacts import ArtifactStore, safe_relative
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Job, Model
from tests.live_service import auth
from tests.service.helpers import count, register

PROBLEM = "application/problem+json"
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cancel_leftovers")]


# --- sources -------------------------------------------------------------------------------------------

def test_only_import_roots_hub_and_allowed_buckets_are_sources(client, fixture_model):
    before = count(Model)
    cases = [
        (f"file://{fixture_model}", "unsupported kind"),  # skipped the import roots before
        ("file:///", "unsupported kind"),  # would have copied the disk
        (f"zip://model::file://{fixture_model}.zip", "unsupported kind"),  # tar-slip through the manifest
        ("http://169.254.169.254/latest/meta-data/", "unsupported kind"),  # SSRF
        ("memory://x", "unsupported kind"),
        (f"simplecache::file://{fixture_model}", "unsupported kind"),
        ("s3://someone-elses-bucket/model", "not one this service may read"),
        ("~\u0098", "source"),
        ("gcs:bucket/model", "unsupported kind"),
    ]
    for source, words in cases:
        answer = register(client, source)
        assert answer.status_code == 422 and answer.headers["content-type"] == PROBLEM, (source, answer.text)
        assert words in answer.text, (source, answer.text)
    assert count(Model) == before


def test_a_link_out_of_the_import_root_is_refused_and_one_inside_followed(client, fixture_model, service_env,
                                                                          tmp_path):
    root = json.loads(service_env["LETHE_IMPORT_ROOTS"])[0]
    assert str(tmp_path).startswith(root)
    leaking = tmp_path / "leaking"
    shutil.copytree(fixture_model, leaking)
    os.symlink("/etc/hostname", leaking / "secret.txt")
    before = count(Model)
    answer = register(client, str(leaking))
    assert answer.status_code == 422 and "links outside the import root" in answer.text
    assert count(Model) == before
    # A Hub cache links snapshot files to blobs under the same root: followed, and the file's bytes stored.
    cached = tmp_path / "cache"
    (cached / "blobs").mkdir(parents=True)
    shutil.copytree(fixture_model, cached / "snapshot")
    (cached / "snapshot" / "config.json").rename(cached / "blobs" / "abc123")
    os.symlink(cached / "blobs" / "abc123", cached / "snapshot" / "config.json")
    answer = register(client, str(cached / "snapshot"))
    assert answer.status_code == 201, answer.text
    files = client.get(f"/v1/models/{answer.json()['id']}/versions/1/files", headers=auth()).json()["files"]
    config = next(f for f in files if f["path"] == "config.json")
    assert config["size"] == (cached / "blobs" / "abc123").stat().st_size


def test_model_files_that_point_elsewhere_or_name_code_are_refused_at_registration(client, fixture_model,
                                                                                    tmp_path):
    """Issue 26: a checkpoint's JSON is read before a byte is copied; each vector answers 422 naming file and key."""
    other = "/some/other/tenant/model.safetensors"
    cases = [
        ("model.safetensors.index.json", {"metadata": {}, "weight_map": {"w": other}}, "key weight_map['w']"),
        ("model.safetensors.index.json", {"metadata": {}, "weight_map": {"w": "../v1/model.safetensors"}},
         "key weight_map['w']"),
        ("config.json", {"auto_map": {"AutoModelForCausalLM": "x--y.Z"}}, "config.json, key auto_map"),
        ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["x--y.T", None]}},
         "tokenizer_config.json, key auto_map"),
        ("tokenizer_config.json", {"tokenizer_file": "/etc/hostname"}, "tokenizer_config.json, key tokenizer_file"),
        ("adapter_config.json", {"base_model_name_or_path": "/srv/models/secret"},
         "adapter_config.json, key base_model_name_or_path"),
    ]
    before = count(Model)
    for i, (name, content, words) in enumerate(cases):
        folder = tmp_path / f"case{i}"
        shutil.copytree(fixture_model, folder)
        path = folder / name
        merged = json.loads(path.read_text()) if path.exists() else {}
        merged.update(content)
        path.write_text(json.dumps(merged))
        answer = register(client, str(folder))
        assert answer.status_code == 422 and answer.headers["content-type"] == PROBLEM, (name, answer.text)
        assert words in answer.json()["detail"], (name, answer.text)
    assert count(Model) == before


def test_the_store_refuses_paths_that_leave_the_version_folder(tmp_path):
    for bad in ("../escaped.txt", "/etc/passwd", "a/../../b", "..", ""):
        with pytest.raises(ValueError):
            safe_relative(bad)
    assert safe_relative("sub/./model.safetensors") == "sub/model.safetensors"
    store = ArtifactStore(str(tmp_path / "store"))
    with pytest.raises(ValueError):
        store.put_files([("ok.txt", 1, lambda: open(__file__, "rb")),
                         ("../../escaped.txt", 1, lambda: open(__file__, "rb"))],
                        "models/m/v1")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "store" / "models").exists()


# --- input that crashed --------------------------------------------------------------------------------

def test_odd_version_numbers_and_page_tokens_are_4xx_and_ranges_past_the_end_clamped(client, registered_model):
    base = f"/v1/models/{registered_model['id']}"
    for number in ("²", "١", "99999999999999999999", "0", "-1", "1.0"):
        answer = client.get(f"{base}/versions/{number}", headers=auth())
        assert answer.status_code == 422 and answer.headers["content-type"] == PROBLEM, (number, answer.text)
    naive = base64.urlsafe_b64encode(json.dumps(["2026-01-01T00:00:00", "job_" + "0" * 32]).encode()).decode()
    for token in ("1" * 40, naive, base64.urlsafe_b64encode(b'["2026-01-01T00:00:00+00:00", 7]').decode(), "%%"):
        answer = client.get("/v1/unlearning-jobs", headers=auth(), params={"page_token": token})
        assert answer.status_code == 422 and "page_token" in answer.text, (token, answer.text)
    answer = client.get(f"{base}/versions/1/files/config.json",
                        headers={**auth(), "Range": "bytes=" + "9" * 5000 + "-"})
    assert answer.status_code == 416
    # A last byte or a suffix length past the end is clamped to the file (RFC 9110 14.1.2): what download managers send.
    whole = client.get(f"{base}/versions/1/files/config.json", headers=auth()).content
    for asked in ("bytes=0-" + "9" * 40, "bytes=-" + "9" * 40, f"bytes=0-{10 ** 12}", f"bytes=-{10 ** 12}"):
        answer = client.get(f"{base}/versions/1/files/config.json", headers={**auth(), "Range": asked})
        assert answer.status_code == 206 and answer.content == whole, (asked, answer.status_code)
        assert answer.headers["content-range"] == f"bytes 0-{len(whole) - 1}/{len(whole)}"


def test_control_characters_surrogates_and_huge_values_are_refused(client, registered_model, forget_records):
    before = count(Job)
    good = {"model_id": registered_model["id"], "request_id": "hardening", "forget": forget_records[:1]}
    cases = [
        {**good, "forget": [{"prompt": "Q", "completion": "A\ud800"}]},  # lone surrogate
        {**good, "forget": [{"prompt": "Q\u0000", "completion": "A"}]},
        {**good, "forget": [{"prompt": "Q", "completion": "x" * 1_000_001}]},
        {**good, "version": 2 ** 63},
        {**good, "params": {"lr": 1e308}},
        {**good, "params": {"max_steps": 10 ** 12}},
        {**good, "params": {"batch_size": 10 ** 9}},
        {**good, "request_id": "a\u0000b"},
    ]
    for body in cases:
        raw = json.dumps(body)  # json.dumps writes the lone surrogate as an escape, as a client would
        answer = client.post("/v1/unlearning-jobs", headers={**auth(), "Content-Type": "application/json"},
                             content=raw.encode())
        assert answer.status_code in (400, 422) and answer.headers["content-type"] == PROBLEM, (raw[:200], answer.text)
    for path in ("/v1/models/%00", "/v1/unlearning-jobs/job_%00x", "/v1/models/x%ff"):
        answer = client.get(path, headers=auth())
        assert answer.status_code == 404 and answer.headers["content-type"] == PROBLEM, (path, answer.text)
    assert count(Job) == before


def test_without_a_valid_key_a_body_is_refused_before_it_is_parsed_and_memory_stays_bounded(client, service_env):
    import tracemalloc

    from lethe.service.api.app import ANONYMOUS_BODY_BYTES

    before = count(Job)
    size = int(service_env["LETHE_MAX_BODY_BYTES"]) - 100  # under the limit a key allows: it was read and parsed
    nested = b"[" + b"[[],[],[],[]]," * (size // 14) + b"[]]"  # nested empty lists: ~25x their size once parsed
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        for headers in ({}, {"Authorization": "Bearer lth_made_up"}):
            answer = client.post("/v1/unlearning-jobs", headers={**headers, "Content-Type": "application/json"},
                                 content=nested)
            assert answer.status_code == 401 and f"over {ANONYMOUS_BODY_BYTES} bytes" in answer.json()["detail"]
        peak = tracemalloc.get_traced_memory()[1]  # the client's copies of the body included
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, f"{peak / 2**20:.0f} MiB allocated at the peak"
    assert count(Job) == before


def test_a_body_of_too_many_lists_and_objects_is_413_before_it_is_parsed(client):
    from lethe.service.api.app import MAX_CONTAINERS

    answer = client.post("/v1/unlearning-jobs", headers={**auth(), "Content-Type": "application/json"},
                         content=b"[" + b"[]," * (MAX_CONTAINERS + 1) + b"[]]")
    assert answer.status_code == 413 and "lists and objects" in answer.json()["detail"]


def test_a_chunked_body_over_the_limit_is_413(client, registered_model, service_env):
    limit = int(service_env["LETHE_MAX_BODY_BYTES"])

    def chunks():  # no Content-Length: the stream is counted
        yield b'{"model_id": "x", "request_id": "big", "forget": ['
        for _ in range(limit // 1000 + 10):
            yield b'{"prompt": "Q", "completion": "' + b"x" * 1000 + b'"},'
        yield b'{"prompt": "Q", "completion": "A"}]}'

    before = count(Job)
    answer = client.post("/v1/unlearning-jobs", headers={**auth(), "Content-Type": "application/json"},
                         content=chunks())
    assert answer.status_code == 413 and answer.json()["type"].endswith("/payload-too-large")
    assert count(Job) == before


def test_concurrent_registrations_with_one_name_give_one_model_and_a_409(client, fixture_model):
    name, answers = "twin-" + uuid.uuid4().hex[:6], []
    threads = [threading.Thread(target=lambda: answers.append(register(client, str(fixture_model), name)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [201, 409, 409], [a.text for a in answers]
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Model).where(Model.name == name)) == 1


# --- the embedded broker ---------------------------------------------------------------------------------

def test_the_embedded_broker_hands_out_messages_in_the_order_they_were_sent(tmp_path):
    from lethe.service.infra.queue import make_celery
    from lethe.service.settings import Settings

    app = make_celery(Settings(broker_url="filesystem://", broker_dir=tmp_path / "broker"))
    with app.connection_for_write() as connection:
        for i in range(12):
            app.send_task("lethe.run_job", args=[f"job-{i}"], queue="q", connection=connection)
        names = os.listdir(tmp_path / "broker" / "queue")
        # Fixed-width names (kombu's own use unpadded uptime in ms, which sorts 1000000 before 999999).
        assert len({len(n.split("_")[0]) for n in names}) == 1
        channel = connection.default_channel
        received = [channel._get("q")["headers"]["argsrepr"] for _ in range(12)]
    assert received == [repr([f"job-{i}"]) for i in range(12)]


def test_safetensors_headers_are_capped_at_registration_and_counted_once(client, fixture_model, tmp_path):
    """Issue 26: a header claiming more than 16 MiB is refused before a byte is copied (the service read up to
    100 MiB per shard on every submission); a registered version's parameter count is read once and kept, so a
    submission reads no header."""
    from lethe.service.domain import capacity
    from lethe.service.infra.tables import ModelVersion

    folder = tmp_path / "huge-header"
    shutil.copytree(fixture_model, folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes((20 * 2**20).to_bytes(8, "little") + data[8:])
    before = count(Model)
    answer = register(client, str(folder))
    assert answer.status_code == 422 and "model.safetensors: a safetensors header of 20971520 bytes" in answer.text
    assert count(Model) == before

    answer = register(client, str(fixture_model))
    assert answer.status_code == 201, answer.text
    with session_scope() as session:
        version = session.scalars(select(ModelVersion).where(ModelVersion.model_id == answer.json()["id"])).one()
        expected = capacity.checkpoint_parameters(ArtifactStore(os.environ["LETHE_ARTIFACT_ROOT"]), version)
        assert version.parameters == expected and expected > 0
        # Counted from the row: a store holding nothing is never asked.
        assert capacity.version_parameters(ArtifactStore(str(tmp_path / "empty-store")), version) == expected


def test_import_roots_granted_to_one_tenant_serve_that_tenant_only(client, fixture_model, tmp_path, monkeypatch):
    """Issue 26: LETHE_TENANT_IMPORT_ROOTS (and LETHE_TENANT_S3_BUCKETS) grant a source to one tenant; with no
    root granted to every tenant, another tenant's folder is outside its roots."""
    from tests.live_service import clear_caches

    granted = tmp_path / "tenant-a-models"
    shutil.copytree(fixture_model, granted / "model")
    keys = {t: client.post("/v1/api-keys", headers=auth(), json={"tenant": t, "scopes": ["models:write"]}).json()["key"]
            for t in ("tenant-a", "tenant-b")}
    monkeypatch.setenv("LETHE_IMPORT_ROOTS", "[]")
    monkeypatch.setenv("LETHE_TENANT_IMPORT_ROOTS", json.dumps({"tenant-a": [str(granted)]}))
    monkeypatch.setenv("LETHE_TENANT_S3_BUCKETS", json.dumps({"tenant-a": ["a-bucket"]}))
    clear_caches()
    try:
        def post(tenant, source):
            return client.post("/v1/models", headers=auth(keys[tenant]),
                               json={"name": "granted-" + uuid.uuid4().hex[:6], "source": source})

        assert post("tenant-a", str(granted / "model")).status_code == 201
        refused = post("tenant-b", str(granted / "model"))
        assert refused.status_code == 422 and "outside the import roots" in refused.text
        assert "outside the import roots" in client.post("/v1/models", headers=auth(), json={
            "name": "nope", "source": str(granted / "model")}).text
        bucket = post("tenant-b", "s3://a-bucket/model")
        assert bucket.status_code == 422 and "not one this service may read" in bucket.text
    finally:
        monkeypatch.undo()
        clear_caches()


def test_the_artifact_store_is_no_source_even_under_an_import_root(client, registered_model, service_env):
    """Issue 26: here the store lies under the import root (as an operator may set it up): a tenant naming a
    stored version's folder would copy another tenant's model. Refused."""
    stored = os.path.join(service_env["LETHE_ARTIFACT_ROOT"], "models", registered_model["id"], "v1")
    assert os.path.isdir(stored) and stored.startswith(json.loads(service_env["LETHE_IMPORT_ROOTS"])[0])
    answer = register(client, stored)
    assert answer.status_code == 422 and "artifact store" in answer.text
