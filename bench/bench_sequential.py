"""`make bench-sequential`: the sequential scenario of SPEC section 10. Ten deletion requests in a row
through the running service (embedded mode: SQLite, filesystem broker, a real worker), each on the
version the last one produced: mini-TOFU authors 180-199 in pairs. Prints the time per request and the
drift of model utility and of every earlier forget set's memorisation; writes bench/results/sequential.json."""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
import torch

from bench.mini_tofu import ROOT, fixture, tofu_records
from lethe.engine.audit.measurements import EvaluationSet, evaluate
from lethe.engine.model.loading import context_length, load_model

RESULTS = ROOT / "bench" / "results" / "sequential.json"
PAIRS = [(180 + 2 * i, 181 + 2 * i) for i in range(10)]
PARAMS = {"max_steps": 2000}
PRESET = "tofu-llama2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memorisation(model_dir: Path, forget_sets: list[list[dict]], retain: list[dict]) -> dict:
    model, tokenizer = load_model(model_dir, torch.device("cpu"))
    length = context_length(model, tokenizer)
    out = {"forget_rouge_l": []}
    for records in forget_sets:
        rs = EvaluationSet(records, tokenizer, length, 0, "forget")
        out["forget_rouge_l"].append(round(evaluate(model, tokenizer, rs, None, None)["forget_verbatim"]
                                           ["rouge_l_recall"]["value"], 3))
    if retain:
        rs = EvaluationSet(retain, tokenizer, length, 0, "retain")
        dummy = EvaluationSet(retain[:2], tokenizer, length, 0, "forget")
        out["utility"] = round(
            evaluate(model, tokenizer, dummy, rs, None)["retain_utility"]["model_utility"]["value"], 3)
    return out


def main() -> None:
    full = fixture("full", log=lambda line: print(line, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="lethe-seq-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env.update(PYTHONPATH=str(ROOT), LETHE_PORT=str(port), LETHE_IMPORT_ROOTS=json.dumps([str(full.parent)]))
    server = subprocess.Popen([sys.executable, "-m", "lethe.embedded"], cwd=work, env=env,
                              stdout=(work / "run.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        time.sleep(5)
        key = (work / ".lethe" / "admin_key").read_text().strip()
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        everything = tofu_records(range(180, 200))
        model = client.post("/v1/models", json={"name": "mini-tofu", "source": str(full)}).raise_for_status().json()
        earlier: list[list[dict]] = []
        for i, pair in enumerate(PAIRS):
            forget = tofu_records(range(pair[0], pair[1] + 1))
            forgotten_ids = {r["id"] for s in earlier + [forget] for r in s}
            retain = [r for r in everything if r["id"] not in forgotten_ids]
            started = time.perf_counter()
            job = client.post("/v1/unlearning-jobs", json={
                "model_id": model["id"], "request_id": f"seq-{i + 1}", "forget": forget, "retain": retain,
                "preset": PRESET, "params": PARAMS, "audit": {"quantization": False, "relearn": False}}).json()
            while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                time.sleep(1)
                job = client.get(f"/v1/unlearning-jobs/{job['id']}").json()
            seconds = time.perf_counter() - started
            if job["state"] != "SUCCEEDED":
                raise SystemExit(f"request {i + 1} ended {job['state']}: {job['error']}")
            number = job["result"]["model_version"]
            archive = client.get(f"/v1/models/{model['id']}/versions/{number}/archive").raise_for_status()
            target = work / f"v{number}"
            with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
                tar.extractall(target, filter="data")
            earlier.append(forget)
            measured = memorisation(next(target.iterdir()), earlier, retain[:100])
            rows.append({"request": i + 1, "authors": list(pair), "version": number, "seconds": round(seconds, 1),
                         "stop_reason": job["result"]["stop_reason"], "steps": job["result"]["steps"], **measured})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    RESULTS.write_text(json.dumps({"command": "make bench-sequential", "preset": PRESET, "rows": rows}, indent=2)
                       + "\n")
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
