"""`make demo`: a scripted client of the running service (started by `make run`). It registers nothing
new: it submits a deletion request against the demo model, follows the job, downloads the new version
and shows what changed on the demo's own records."""
from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

BASE = os.environ.get("LETHE_URL", "http://127.0.0.1:8000")


def main() -> int:
    key_file = Path(".lethe/admin_key")
    key = os.environ.get("LETHE_ADMIN_KEY") or (key_file.read_text().strip() if key_file.exists() else "")
    if not key:
        print("no admin key: `make run` writes one to .lethe/admin_key unless LETHE_ADMIN_KEY was set when it "
              "started; then set the same LETHE_ADMIN_KEY here (run this from the folder of `make run`)",
              file=sys.stderr)
        return 2
    forget = json.loads(Path(".lethe/demo/forget.json").read_text())
    client = httpx.Client(base_url=BASE, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    demo = next(m for m in client.get("/v1/models").raise_for_status().json()["items"] if m["name"] == "demo")
    request_id = f"demo-{int(time.time())}"
    answer = client.post("/v1/unlearning-jobs", headers={"Idempotency-Key": request_id},
                         json={"model_id": demo["id"], "request_id": request_id, "forget": forget})
    if answer.status_code != 202:
        print(f"submit failed: {answer.status_code} {answer.text}", file=sys.stderr)
        return 1
    job = answer.json()
    # No version named: the job starts from the head, the version that holds every erasure so far.
    print(f"submitted {job['id']} (request {request_id}): forget {job['forget']['count']} records of model demo "
          f"(from v{job['base_version']})")
    while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        time.sleep(1)
        job = client.get(f"/v1/unlearning-jobs/{job['id']}").json()
        p = job["progress"]
        print(f"  {job['state']:<10} step {p.get('step') or 0:>4}  V {p.get('violation_rate')}", flush=True)
    if job["state"] != "SUCCEEDED":
        print(f"job ended {job['state']}: {job['error']}", file=sys.stderr)
        return 1
    number = job["result"]["model_version"]
    print(f"done: {job['result']['stop_reason']} after {job['result']['steps']} steps, "
          f"{job['result']['wall_seconds']:.1f} s -> version {number}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, number):
            archive = client.get(f"/v1/models/{demo['id']}/versions/{n}/archive").raise_for_status()
            with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
                tar.extractall(Path(tmp) / f"v{n}", filter="data")
        retain = json.loads(Path(".lethe/demo/retain.json").read_text())
        show_changes(next((Path(tmp) / "v1").iterdir()), next((Path(tmp) / f"v{number}").iterdir()), forget, retain)
    return 0


def show_changes(before: Path, after: Path, forget: list[dict], retain: list[dict]) -> None:
    import torch

    from lethe.engine.data.records import encode_records
    from lethe.engine.model.generation import greedy_continuations
    from lethe.engine.model.loading import load_model

    old, tokenizer = load_model(before, torch.device("cpu"))
    new, _ = load_model(after, torch.device("cpu"))
    for title, records in (("forgotten", forget[:5]), ("kept (retain set)", retain[:3])):
        encoded = encode_records(records, tokenizer, max_length=512, seed=0, what="demo")
        was, now = greedy_continuations(old, tokenizer, encoded), greedy_continuations(new, tokenizer, encoded)
        print(f"\nwhat the model answers, {title}, before -> after:")
        for record, a, b in zip(encoded, was, now):
            print(f"  {record.source['prompt'].strip()!r}\n    {tokenizer.decode(a, skip_special_tokens=True)!r}\n"
                  f" -> {tokenizer.decode(b, skip_special_tokens=True)!r}")


if __name__ == "__main__":
    sys.exit(main())
