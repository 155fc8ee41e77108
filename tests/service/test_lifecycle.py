"""A deletion request through the running service: submit, follow, download, verify, reload; cancel;
and a worker SIGKILLed in the middle of a job."""
import hashlib
import io
import json
import tarfile
import time
import uuid

import pytest  # noqa: I001
import torch
from transformers import AutoModelForCausalLM

from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import encode_records
from lethe.engine.model.architectures import Size, tiny_config
from lethe.engine.model.fixture import train_tokenizer
from lethe.engine.model.generation import exact_match
from lethe.engine.model.loading import load_model
from lethe.service.infra.artifacts import manifest_sha256
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Job, ModelVersion
from tests.live_service import auth, wait_for
from tests.service.browser import layout

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

FAST = {"lr": 1e-3, "max_steps": 1000}


def submit(client, model, forget, request_id, params=None, key=None, **extra):
    headers = {**auth(), **({"Idempotency-Key": key} if key else {})}
    return client.post("/v1/unlearning-jobs", headers=headers,
                       json={"model_id": model["id"], "request_id": request_id, "forget": forget,
                             "params": params or FAST, **extra})


def versions(client, model):
    return client.get(f"/v1/models/{model['id']}/versions", headers=auth()).json()["items"]


def test_full_life_of_a_deletion_request(client, worker, registered_model, forget_records, retain_records, tmp_path):
    # Version 1 stands in as the retrain reference for this forget set (the mechanism, not a real retrain).
    marked = client.post(f"/v1/models/{registered_model['id']}/references", headers=auth(),
                         json={"version": 1, "forget": forget_records})
    assert marked.status_code == 201, marked.text
    # The tiny fixture samples a forgotten hobby about 1 % of the time: the request sets its own threshold.
    answer = submit(client, registered_model, forget_records, "dsar-full-life", holdout=retain_records[:10],
                    audit={"secret_sampled_max": 0.05})
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert answer.headers["location"] == f"/v1/unlearning-jobs/{job['id']}"
    assert job["state"] == "QUEUED" and job["forget"]["count"] == len(forget_records)
    # Server-sent events follow it to the end.
    with client.stream("GET", f"/v1/unlearning-jobs/{job['id']}/events", headers=auth()) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("event:")]
    assert "event: progress" in events and events[-1] == "event: state" and events.count("event: state") >= 2
    done = wait_for(client, job["id"])
    assert done["state"] == "SUCCEEDED", done
    assert done["result"]["stop_reason"] == "alpha" and done["result"]["model_version"] == 2
    assert done["progress"]["step"] == done["result"]["steps"] and done["attempt"] == 1

    version = client.get(f"/v1/models/{registered_model['id']}/versions/2", headers=auth()).json()
    assert version["parent"] == 1 and version["job_id"] == job["id"]
    assert version["erased_request_ids"] == ["dsar-full-life"]
    engine = client.get(f"/v1/unlearning-jobs/{job['id']}/result", headers=auth()).json()
    assert engine["stop_reason"] == "alpha" and engine["bound"]["aggregate"]["records"] == len(forget_records)

    # The archive: every file's sha256 matches the manifest, and the manifest its hash.
    files = client.get(f"/v1/models/{registered_model['id']}/versions/2/files", headers=auth()).json()
    archive = client.get(f"/v1/models/{registered_model['id']}/versions/2/archive", headers=auth())
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
        tar.extractall(tmp_path, filter="data")
    assert {f["path"] for f in files["files"]} == set(members)
    for entry in files["files"]:
        assert hashlib.sha256(members[entry["path"]]).hexdigest() == entry["sha256"]
    assert manifest_sha256(files["files"]) == files["manifest_sha256"] == version["manifest_sha256"]
    card = members["README.md"].decode()  # the model card names the lineage, never the records
    assert "dsar-full-life" in card and "Parent version: 1" in card and forget_records[0]["completion"] not in card
    latest = client.get(f"/v1/models/{registered_model['id']}/versions/latest", headers=auth()).json()
    assert latest["number"] == 2

    # One file with Range and ETag.
    weights = next(f for f in files["files"] if f["path"] == "model.safetensors")
    part = client.get(f"/v1/models/{registered_model['id']}/versions/2/files/model.safetensors",
                      headers={**auth(), "Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == members["model.safetensors"][100:200]
    assert part.headers["etag"] == f'"{weights["sha256"]}"'
    assert part.headers["content-range"] == f"bytes 100-199/{weights['size']}"

    # The downloaded version loads with from_pretrained and no longer reproduces the forget set.
    model, tokenizer = load_model(next(tmp_path.iterdir()), torch.device("cpu"))
    forget = encode_records(normalise_records(forget_records, "forget"), tokenizer, max_length=512, seed=0,
                            what="forget")
    assert exact_match(model, tokenizer, forget)["value"] <= 0.1

    # The audit report: a verdict, the metrics before and after, and no forget text.
    report = client.get(f"/v1/unlearning-jobs/{job['id']}/report", headers=auth()).json()
    assert report["verdict"]["forgotten"] is True, report["verdict"]
    audit = report["audit"]
    assert audit["before"]["forget_verbatim"]["exact_match"]["value"] == 1.0
    # Audited as served: the stored files loaded back, in the checkpoint's dtype.
    assert audit["checked_on"] == {"weights": "the stored checkpoint, loaded back", "dtype": "float32"}
    assert audit["after"]["forget_verbatim"]["exact_match"]["value"] <= 0.1
    assert audit["forget_quality"]["value"] is not None  # against the marked reference
    assert audit["privleak"]["loss"]["reference"] == "retrain reference"
    # The extraction audit, before and after, by record id; the request's threshold decided.
    assert audit["options"]["secret_sampled_max"] == 0.05 and audit["secrets"]["extracted"] > 0
    secrets_before, secrets_after = audit["before"]["forget_secrets"], audit["after"]["forget_secrets"]
    assert secrets_before["greedy"]["value"] == 1.0 and secrets_after["greedy"]["value"] == 0.0
    assert secrets_after["sampled"]["value"] <= 0.05 < secrets_before["sampled"]["value"]
    assert any(line.startswith("samples at temperature 1: no record") for line in report["verdict"]["evidence"])
    # The verdict's table: every forget record on every channel, by id.
    cells = {(r["record"], r["channel"]) for r in report["verdict"]["records"]}
    assert {rid for rid, _ in cells} == {r["id"] for r in forget_records} and len(cells) == 7 * len(forget_records)
    assert set(audit["after"]["degeneration"]) >= {"forget", "retain"}
    assert report["evidence"]["forget_manifest_sha256"] == job["forget"]["manifest_sha256"]
    assert report["evidence"]["new_version"]["manifest_sha256"] == version["manifest_sha256"]
    text = json.dumps(report)
    assert not any(r["completion"] in text for r in forget_records)
    page = client.get(f"/v1/unlearning-jobs/{job['id']}/report.html", headers=auth())
    assert page.status_code == 200 and "Forgotten:" in page.text and "<svg" in page.text and "http" not in \
        page.text.split("<body>")[1].replace("https://lethe.dev", "")

    # Rendered by a real browser: the verdict is on the first screen, the charts and evidence are drawn.
    seen = layout(page.text, screenshot=tmp_path / "report.png")
    [verdict] = seen["verdict"]
    assert verdict["visible"] and verdict["top"] < seen["viewport"] and verdict["text"].startswith("Forgotten:")
    assert len(seen["charts"]) >= 4 and all(c["visible"] for c in seen["charts"])
    cells = [c["text"] for c in seen["evidence"]]
    assert "dsar-full-life" in cells and job["forget"]["manifest_sha256"] in " ".join(cells)
    assert (tmp_path / "report.png").stat().st_size > 10_000
    secret_cells = [c["text"] for c in seen["secrets"] if c["visible"]]  # probe, before, after, leaking ids
    assert "greedy answer to the prompt" in secret_cells and "100.0%" in secret_cells and "0.0%" in secret_cells
    assert "samples at temperature 1 (10 per record, share of samples)" in secret_cells
    fluency_cells = [c["text"] for c in seen["fluency"] if c["visible"]]
    assert "forget prompts" in fluency_cells and "retain prompts" in fluency_cells
    # The per-record matrix: a row per forget record, a visible mark per channel, no record leaking.
    assert sorted(row["record"] for row in seen["matrix"]) == sorted(r["id"] for r in forget_records)
    assert all(len(row["cells"]) == 7 and all(c["visible"] for c in row["cells"]) for row in seen["matrix"])
    assert not any(c["text"] == "LEAK" for row in seen["matrix"] for c in row["cells"])

    # The audit log holds the job's life, and its chain verifies.
    entries = client.get("/v1/audit-log", headers=auth(), params={"page_size": 1000}).json()["items"]
    kinds = [e["kind"] for e in entries if e["subject"] == job["id"] or e["data"].get("job_id") == job["id"]]
    assert kinds == ["job.queued", "job.running", "version.created", "report.created", "job.succeeded"]
    assert client.get("/v1/audit-log/verify", headers=auth()).json()["ok"] is True

    # The erased data is gone from the database; its evidence stays.
    with session_scope() as session:
        row = session.get(Job, job["id"])
        assert row.forget_records is None
        assert row.forget_evidence["count"] == len(forget_records)
        assert len(row.forget_evidence["records"]) == len(forget_records)
        assert "completion" not in json.dumps(row.forget_evidence)


def test_cancel_a_running_job(client, worker, registered_model, forget_records):
    before = len(versions(client, registered_model))
    slow = {"lr": 1e-7, "max_steps": 100000, "check_every": 1000}  # would run for many minutes
    job = submit(client, registered_model, forget_records, "dsar-cancel", params=slow).json()
    wait_for(client, job["id"], states=("RUNNING",), condition=lambda j: (j["progress"].get("step") or 0) > 2)
    answer = client.post(f"/v1/unlearning-jobs/{job['id']}:cancel", headers=auth())
    assert answer.status_code == 200 and answer.json()["state"] in ("CANCELLING", "CANCELLED")
    done = wait_for(client, job["id"], timeout=60)
    assert done["state"] == "CANCELLED" and done["result"]["model_version"] is None
    assert len(versions(client, registered_model)) == before
    again = client.post(f"/v1/unlearning-jobs/{job['id']}:cancel", headers=auth())
    assert again.status_code == 409 and again.headers["content-type"] == "application/problem+json"


def test_sigkilled_worker_job_is_retried_and_succeeds_exactly_once(client, worker, registered_model, forget_records):
    params = {"lr": 1e-3, "max_steps": 150, "check_every": 1000}  # runs to max_steps: long enough to kill
    job = submit(client, registered_model, forget_records, "dsar-sigkill", params=params).json()
    wait_for(client, job["id"], states=("RUNNING",), condition=lambda j: (j["progress"].get("step") or 0) > 5)
    worker.kill()
    time.sleep(1)
    worker.start()
    done = wait_for(client, job["id"])
    assert done["state"] == "SUCCEEDED", done
    assert done["attempt"] == 2 and done["result"]["steps"] == 150
    with session_scope() as session:
        made = session.query(ModelVersion).filter_by(job_id=job["id"]).all()
    assert len(made) == 1 and made[0].number == done["result"]["model_version"]


def test_a_worker_killed_after_training_while_it_saves_and_audits_leaves_one_version(client, worker, registered_model,
                                                                                      forget_records):
    """Killed once the last step is done (the model being saved, audited, its version not yet made): the next
    attempt runs again, and exactly one version comes of the job, numbered next, in its own attempt's folder."""
    before = [v["number"] for v in versions(client, registered_model)]
    params = {"lr": 1e-3, "max_steps": 30, "check_every": 1000}
    job = submit(client, registered_model, forget_records, "dsar-kill-at-save", params=params).json()
    wait_for(client, job["id"], states=("RUNNING",), condition=lambda j: (j["progress"].get("step") or 0) >= 30)
    assert client.get(f"/v1/unlearning-jobs/{job['id']}", headers=auth()).json()["state"] == "RUNNING"
    worker.kill()
    time.sleep(1)
    worker.start()
    done = wait_for(client, job["id"])
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
    after = [v["number"] for v in versions(client, registered_model)]
    assert after == before + [max(before) + 1] and done["result"]["model_version"] == max(before) + 1
    with session_scope() as session:
        [made] = session.query(ModelVersion).filter_by(job_id=job["id"]).all()
    assert made.location == f"jobs/{job['id']}/attempt-2/model"


def test_a_baseline_runs_its_budget_through_the_service(client, worker, registered_model, forget_records):
    job = submit(client, registered_model, forget_records, "dsar-graddiff", method="graddiff",
                 params={"epochs": 2, "effective_batch": 4, "lr": 1e-3},
                 audit={"quantization": False, "relearn": False}).json()
    done = wait_for(client, job["id"])
    assert done["state"] == "SUCCEEDED", done
    assert done["result"]["stop_reason"] == "budget" and done["result"]["steps"] == 6  # 2 epochs x ceil(10 / 4)
    report = client.get(f"/v1/unlearning-jobs/{job['id']}/report", headers=auth()).json()
    assert "graddiff ran its fixed budget of 6 steps" in report["verdict"]["evidence"]
    assert "quantization" not in report["audit"] and "relearning" not in report["audit"]


def test_a_gpt2_model_is_unlearned_with_no_parameters(client, worker, forget_records, retain_records, tmp_path):
    """Any architecture through the API: a GPT-2 model (Conv1D projections) registered and a job with no
    parameters; the default (lora "auto": whitened full fine-tuning, as the model has retain records) finds its
    projections, and the report names what was trained."""
    tokenizer = train_tokenizer(forget_records + retain_records, 300)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2", Size(vocab_size=len(tokenizer)),
                                                         eos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    registered = client.post("/v1/models", headers=auth(), json={"name": "gpt2-" + uuid.uuid4().hex[:6],
                                                                 "source": str(tmp_path / "gpt2"),
                                                                 "retain": retain_records})
    assert registered.status_code == 201, registered.text
    job = client.post("/v1/unlearning-jobs", headers=auth(),
                      json={"model_id": registered.json()["id"], "request_id": "dsar-gpt2", "forget": forget_records,
                            "audit": {"quantization": False, "relearn": False}}).json()
    done = wait_for(client, job["id"])
    assert done["state"] == "SUCCEEDED", done["error"]
    engine = client.get(f"/v1/unlearning-jobs/{job['id']}/result", headers=auth()).json()
    assert engine["params"]["lora_targets"] == "auto" and engine["alpha"]["source"] == "auto"
    assert (engine["params"]["lora"], engine["params"]["whiten_updates"]) == (False, True)
    assert set(engine["lora"]["whitened"]["modules"]) == {"c_attn", "c_proj", "c_fc"}
    assert engine["erasure"]["failing_ids"] == [] and len(engine["per_record"]) == len(forget_records)
    report = client.get(f"/v1/unlearning-jobs/{job['id']}/report", headers=auth()).json()
    assert report["stop_rule"]["alpha"] == engine["alpha"]["value"]
