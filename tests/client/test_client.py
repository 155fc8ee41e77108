"""The Python client and the `lethe` command (issue 14) against the real service: a uvicorn process on PostgreSQL,
Redis and the session's worker. From a file to a verified checkpoint and a report in one command; resumable,
verified downloads; exit codes that say what happened; client types that match the service's OpenAPI schema."""
import json
import os
import socket
import subprocess
import sys
import time
import typing
import uuid
from pathlib import Path

import httpx
import pytest

from lethe.client import Client, LetheError, VerificationError, types
from tests.conftest import write_jsonl
from tests.live_service import ADMIN_KEY, ROOT

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

FAST = ["--param", "lr=1e-3", "--param", "max_steps=1000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(service_env, tmp_path_factory):
    """The API as it runs in production: uvicorn in its own process."""
    port = free_port()
    log = tmp_path_factory.mktemp("uvicorn") / "server.log"
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "lethe.service.api.app:app", "--port", str(port)],
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log.open("w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        assert process.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.3)
    yield url
    process.terminate()
    process.wait(timeout=30)


def lethe(server_url, *args, key=ADMIN_KEY, cwd=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env.update(PYTHONPATH=str(ROOT), LETHE_URL=server_url, LETHE_CONFIG=str(Path(cwd or ROOT) / "no-config.json"))
    if key:
        env["LETHE_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "lethe.client.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd or ROOT, timeout=timeout)


def test_the_client_types_match_the_services_schema(server):
    components = httpx.get(f"{server}/openapi.json").json()["components"]["schemas"]
    pairs = {types.Model: "ModelOut", types.Version: "VersionOut", types.Job: "JobOut", types.Progress: "Progress",
             types.JobResult: "JobResult"}
    for cls, name in pairs.items():
        properties = components[name]["properties"]
        assert set(cls.model_fields) == set(properties), (cls.__name__, set(cls.model_fields) ^ set(properties))
        for field, info in cls.model_fields.items():
            nullable = type(None) in typing.get_args(info.annotation)
            schema = properties[field]
            server_nullable = any(s.get("type") == "null" for s in schema.get("anyOf", []))
            assert nullable == server_nullable or not nullable, (cls.__name__, field)


def test_erase_goes_from_a_file_to_a_verified_checkpoint_and_a_report(server, worker, registered_model,
                                                                      forget_records, tmp_path):
    forget = write_jsonl(tmp_path / "people.jsonl", forget_records[:5])
    out, report = tmp_path / "out", tmp_path / "report.json"
    done = lethe(server, "erase", "--model", registered_model["name"], "--forget", str(forget), *FAST,
                 "--subject", "person-9", "--wait", "--download", str(out), "--report", str(report), cwd=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "RUNNING step" in done.stderr and "alpha" in done.stderr  # progress, plain lines off a terminal
    assert "sha256 verified" in done.stdout and ("Forgotten" in done.stdout or "Not established" in done.stdout)
    client = Client(server, ADMIN_KEY)
    [job] = [j for j in client.jobs(model_id=registered_model["id"]) if j.request_id.startswith("lethe-")]
    assert job.state == "SUCCEEDED" and job.result.model_version is not None
    manifest = client.manifest(job.model_id, job.result.model_version)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(f.path for f in manifest)
    assert json.loads(report.read_text())["job_id"] == job.id
    assert client.subject("person-9")["requests"][0]["job_id"] == job.id
    # The same file again is the same request: the Idempotency-Key replays the first job, no second one.
    again = lethe(server, "erase", "--model", registered_model["id"], "--forget", str(forget), *FAST,
                  "--subject", "person-9", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["job"]["id"] == job.id
    follow = lethe(server, "follow", job.id, "--json")
    assert follow.returncode == 0 and json.loads(follow.stdout)["state"] == "SUCCEEDED"
    listed = lethe(server, "models", "versions", registered_model["id"], "--json")
    assert job.result.model_version in [v["number"] for v in json.loads(listed.stdout)]
    audit = lethe(server, "audit-verify", "--json")
    assert audit.returncode == 0 and json.loads(audit.stdout)["ok"] is True


def test_a_download_resumes_a_partial_file_and_refuses_bytes_that_do_not_match(server, registered_model, tmp_path):
    client = Client(server, ADMIN_KEY)
    first = client.download(registered_model["id"], 1, tmp_path / "v1")
    assert first["kept"] == 0 and first["resumed"] == 0 and first["bytes_fetched"] > 0
    weights = next((tmp_path / "v1").glob("*.safetensors"))
    whole = weights.read_bytes()
    # Interrupted half-way: the next call asks only for the rest (Range) and verifies the whole file.
    partial = weights.with_name(weights.name + ".part")
    partial.write_bytes(whole[:len(whole) // 2])
    weights.unlink()
    again = client.download(registered_model["id"], 1, tmp_path / "v1")
    assert again["resumed"] == 1 and again["bytes_fetched"] == len(whole) - len(whole) // 2
    assert weights.read_bytes() == whole and again["kept"] == again["files"] - 1
    # A partial file with other bytes in it cannot become the checkpoint: refused, and gone for the next try.
    weights.unlink()
    partial.write_bytes(b"\0" * (len(whole) // 2))
    with pytest.raises(VerificationError, match="sha256"):
        client.download(registered_model["id"], 1, tmp_path / "v1")
    assert not partial.exists() and not weights.exists()
    cli = lethe(server, "download", registered_model["id"], str(tmp_path / "v1"), "--version", "1", "--json")
    assert cli.returncode == 0 and weights.read_bytes() == whole, cli.stderr


def test_exit_codes_say_what_happened(server, worker, registered_model, forget_records, tmp_path):
    forget = write_jsonl(tmp_path / "f.jsonl", forget_records[:2])
    unknown = lethe(server, "erase", "--model", "no-such-model", "--forget", str(forget))
    assert unknown.returncode == 2 and "no-such-model" in unknown.stderr
    refused = lethe(server, "erase", "--model", registered_model["id"], "--forget", str(forget),
                    "--param", "rho=7")
    assert refused.returncode == 2 and "rho" in refused.stderr and "Traceback" not in refused.stderr
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text("{not json}\n")
    assert lethe(server, "erase", "--model", registered_model["id"], "--forget", str(bad_file)).returncode == 2
    no_key = lethe(server, "models", "list", key=None, cwd=tmp_path)
    assert no_key.returncode == 2 and "401" in no_key.stderr
    assert lethe(f"http://127.0.0.1:{free_port()}", "models", "list").returncode == 3
    # A job that fails on the worker (a completion longer than the context it is given): exit 1, with the reason.
    long = write_jsonl(tmp_path / "long.jsonl", [{"id": "l", "prompt": "Q: ", "completion": "word " * 40}])
    failed = lethe(server, "erase", "--model", registered_model["id"], "--forget", str(long), "--param",
                   "max_length=8", "--wait", "--request-id", "dsar-too-long")
    assert failed.returncode == 1 and "FAILED" in failed.stderr and "context" in failed.stderr, failed.stderr
    with pytest.raises(LetheError) as caught:
        Client(server, ADMIN_KEY).submit(registered_model["id"], [{"id": "x"}], request_id="dsar-bad")
    assert caught.value.status == 422 and caught.value.errors[0]["field"] == "forget"


def test_versions_are_retired_and_purged_from_the_command_line(server, worker, registered_model, forget_records,
                                                                tmp_path):
    client = Client(server, ADMIN_KEY)
    forget = write_jsonl(tmp_path / "cli-retire.jsonl", forget_records[5:8])
    done = lethe(server, "erase", "--model", registered_model["id"], "--forget", str(forget), *FAST, "--wait",
                 "--request-id", "cli-retire", "--json")
    assert done.returncode == 0, done.stderr
    head = client.version(registered_model["id"])
    parent = head.parent
    assert parent is not None
    retired = lethe(server, "models", "retire", registered_model["name"], str(parent), "--json")
    assert retired.returncode == 0 and json.loads(retired.stdout)["state"] == "RETIRED", retired.stderr
    unconfirmed = lethe(server, "models", "purge", registered_model["name"], str(parent))
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    refused = lethe(server, "models", "purge", registered_model["name"], str(head.number), "--yes")
    assert refused.returncode == 2 and "head" in refused.stderr, refused.stderr
    purged = lethe(server, "models", "purge", registered_model["name"], str(parent), "--yes", "--json")
    assert purged.returncode == 0 and json.loads(purged.stdout)["purged_at"], purged.stderr
    with pytest.raises(LetheError) as gone:
        client.download(registered_model["id"], parent, tmp_path / "gone")
    assert gone.value.status == 410
    listed = lethe(server, "models", "versions", registered_model["id"])
    assert f"v{parent} " in listed.stdout and "PURGED" in listed.stdout
    setting = lethe(server, "models", "settings", registered_model["id"], "--retire-predecessors", "--json")
    assert setting.returncode == 0 and json.loads(setting.stdout)["retire_predecessors"] is True


def test_a_models_utility_set_is_registered_and_replaced_from_the_command_line(server, fixture_model, retain_records,
                                                                               tmp_path):
    utility = write_jsonl(tmp_path / "utility.jsonl", retain_records[:3])
    name = "cli-utility-" + uuid.uuid4().hex[:8]
    registered = lethe(server, "models", "register", name, str(fixture_model), "--utility", str(utility), "--json")
    assert registered.returncode == 0, registered.stderr
    assert json.loads(registered.stdout)["utility_count"] == 3
    # A setting given alone leaves the utility set as it is; an empty file removes it.
    kept = lethe(server, "models", "settings", name, "--retire-predecessors", "--json")
    assert kept.returncode == 0 and json.loads(kept.stdout)["utility_count"] == 3, kept.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    removed = lethe(server, "models", "settings", name, "--utility", str(empty), "--json")
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout)["utility_count"] == 0 and json.loads(removed.stdout)["retire_predecessors"]
    assert Client(server, ADMIN_KEY).update_model(json.loads(registered.stdout)["id"],
                                                  utility=retain_records[:2]).utility_count == 2
