"""`make bench-sequential` (issue 28): a model under a stream of deletion requests, through the running service
(embedded mode: SQLite, filesystem broker, a real worker process), with the default job (no parameters).

The fixture learns mini-TOFU's 400 QA (authors 180-199) and TOFU's 117 world facts. The model is registered with a
retain set of the 400 QA and the first 60 world facts; the other 57 world facts are never in a retain set (the
utility set: knowledge no retain term protects). Two scenarios on two registrations of the same fixture:
- sequential: ten requests of two authors each (180-181, ..., 198-199), one after the other, each on the version
  the last one made. After every request the new version is downloaded and measured: every erased set so far
  (greedy exact match, greedy secret leakage), the retain set as it is then (exact match on a seeded sample of
  100), the utility set (model utility), each beside the base's on the same records. The 57 are also the model's
  utility set in the service, so each job's own audit measures them (`audited_utility`: the new version and the
  one the request started from).
- together: the same ten requests submitted at once (coalesced by the service), timed from the first submission
  to the last job's end, against the first sequential request's time measured in the same run.
Prints the rows and the issue's checks; writes bench/results/sequential.json and BENCHMARKS.md's block.

`--anchor previous` pins each request's retain anchor to the version it starts from (the behaviour before issue
28, for comparison: PATCH anchor_version before each request) and writes sequential-anchor-previous.json and a block
of its own; `--requests N` runs the first N pairs only (sequential-N-requests.json, its own block too); `--preset
NAME` has every job name that MASC preset (sequential-preset-NAME[...].json, its own block)."""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
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

from bench.mini_tofu import ROOT, fixture, tofu_records, update_benchmarks, world_facts
from bench.utility_margins import margin_summary, weakest_margins
from lethe.engine.audit.extraction import greedy_leaks, request_secrets
from lethe.engine.audit.measurements import EvaluationSet, evaluate, retain_utility, verbatim
from lethe.engine.audit.metrics.text import generation_metrics
from lethe.engine.audit.relearn import relearning_probe
from lethe.engine.data.secrets import leaked_secrets
from lethe.engine.model.loading import context_length, load_model

RESULTS = ROOT / "bench" / "results" / "sequential.json"
PAIRS = [(180 + 2 * i, 181 + 2 * i) for i in range(10)]
AUDIT = {"quantization": False, "relearn": False}  # the audit's other channels run; these two cost the most
RETAIN_SAMPLE = 100
COMMAND = "make bench-sequential"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Measurer:
    """One model's figures on the erased sets, the retain sample and the utility set."""

    def __init__(self, model_dir: Path, device: torch.device = torch.device("cpu")):
        self.model, self.tokenizer = load_model(model_dir, device)
        self.length = context_length(self.model, self.tokenizer)

    def evaluation_set(self, records: list[dict], what: str) -> EvaluationSet:
        return EvaluationSet(records, self.tokenizer, self.length, 0, what)

    def erased(self, records: list[dict], secrets: dict, distinctive: dict | None = None) -> dict:
        """Greedy exact match and secret leakage of an erased set; with `distinctive` (distinctive_secrets), also
        the leakage of those secrets alone."""
        out = evaluate(self.model, self.tokenizer, self.evaluation_set(records, "forget"), None, None,
                       secrets=secrets, samples=0)
        generated = out["forget_verbatim"]["generated"]
        figures = {"exact_match": out["forget_verbatim"]["exact_match"]["value"],
                   "leak_greedy": out["forget_secrets"]["greedy"]["value"],
                   "answers": dict(list(generated.items())[:3])}
        if distinctive is not None:
            figures["leak_distinctive"] = greedy_leaks(generated, distinctive).get("value") or 0.0
            figures["leaking_distinctive"] = {rid: said for rid, text in generated.items()
                                              if (said := [x for x in distinctive.get(rid, [])
                                                           if leaked_secrets([x], text)])}
        return figures

    def relearned(self, records: list[dict], secrets: dict) -> dict:
        """The audit's relearning probe on an erased set (a copy fine-tuned on half of it, the other half measured,
        twice): the share of its records with `secrets` whose greedy answer says one after the last budget, the
        share before any relearning step, and those records' ids."""
        chosen = self.evaluation_set(records, "forget")
        points = relearning_probe(self.model, self.tokenizer, chosen.main, chosen.references, seed=0,
                                  secrets=secrets)["points"]
        return {"before": points[0]["secret_leak"], "after": points[-1]["secret_leak"],
                "leaking": points[-1]["leaking_ids"]}

    def retain_exact_match(self, records: list[dict]) -> float:
        return verbatim(self.model, self.tokenizer, self.evaluation_set(records, "retain"))["exact_match"]["value"]

    def answers(self, records: list[dict]) -> dict[str, str]:
        """Each record's greedy answer to its prompt."""
        chosen = self.evaluation_set(records, "retain")
        return generation_metrics(self.model, self.tokenizer, chosen.main, chosen.references)["generated"]

    def utility(self, records: list[dict]) -> float:
        return self.utility_parts(records)["utility"]

    def utility_margins(self, records: list[dict]) -> dict:
        """How close the records' answers are to flipping (bench.utility_margins)."""
        return margin_summary(weakest_margins(self.model, self.evaluation_set(records, "retain").main,
                                              self.tokenizer.pad_token_id))

    def utility_parts(self, records: list[dict]) -> dict[str, float]:
        """Model utility and what it is the harmonic mean of (answer probability, ROUGE-L recall)."""
        out = retain_utility(self.model, self.tokenizer, self.evaluation_set(records, "retain"))
        return {"utility": round(out["model_utility"]["value"], 3),
                "probability": round(out["probability"]["value"], 3),
                "rouge_l_recall": round(out["rouge_l_recall"]["value"], 3)}


class Service:
    """`lethe.embedded` in a subprocess of its own, on a free port, in a temporary folder."""

    def __init__(self, import_root: Path):
        self.work = Path(tempfile.mkdtemp(prefix="lethe-seq-"))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
        env.update(PYTHONPATH=str(ROOT), LETHE_PORT=str(port), LETHE_IMPORT_ROOTS=json.dumps([str(import_root)]))
        self.process = subprocess.Popen([sys.executable, "-m", "lethe.embedded"], cwd=self.work, env=env,
                                        stdout=(self.work / "run.log").open("w"), stderr=subprocess.STDOUT,
                                        start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        time.sleep(5)
        key = (self.work / ".lethe" / "admin_key").read_text().strip()
        self.client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)

    def register(self, name: str, source: Path, retain: list[dict], utility: list[dict]) -> str:
        return self.client.post("/v1/models", json={"name": name, "source": str(source), "retain": retain,
                                                    "utility": utility}).raise_for_status().json()["id"]

    def submit(self, model: str, request_id: str, forget: list[dict], preset: str | None = None) -> str:
        job = {"model_id": model, "request_id": request_id, "forget": forget, "audit": AUDIT}
        answer = self.client.post("/v1/unlearning-jobs", json=job | ({"preset": preset} if preset else {}))
        return answer.raise_for_status().json()["id"]

    def wait(self, job_id: str) -> dict:
        while True:
            job = self.client.get(f"/v1/unlearning-jobs/{job_id}").json()
            if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                if job["state"] != "SUCCEEDED":
                    raise SystemExit(f"job {job_id} ended {job['state']}: {job['error']}")
                return job
            time.sleep(1)

    def report(self, job_id: str) -> dict:
        return self.client.get(f"/v1/unlearning-jobs/{job_id}/report").raise_for_status().json()

    def download(self, model: str, number: int) -> Path:
        archive = self.client.get(f"/v1/models/{model}/versions/{number}/archive").raise_for_status()
        target = self.work / f"{model}-v{number}"
        with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
            tar.extractall(target, filter="data")
        return next(target.iterdir())


def set_secrets(sets: list[list[dict]], tofu: list[dict], facts: list[dict]) -> tuple[list[dict], list[dict]]:
    """Per erased set, its records' extracted secrets (against the other QA) and their distinctive part (against
    every record outside the set: the other QA and the world facts)."""
    ids = [{x["id"] for x in s} for s in sets]
    outside = [[r for r in tofu if r["id"] not in own] for own in ids]
    secrets = [request_secrets(s, others) for s, others in zip(sets, outside)]
    return secrets, [distinctive_secrets(found, others + facts) for found, others in zip(secrets, outside)]


def distinctive_secrets(secrets: dict[str, list[str]], others: list[dict]) -> dict[str, list[str]]:
    """Each record's secrets that no record outside its set says: those a model could only have from the erased
    set itself. A generic word the extraction keeps ("significant", "honored") or a fact another author shares
    ("Born in Taipei", said of a kept author too) drops out: a model that never saw the set says those as well, so
    their coming back in an answer does not show the erased record coming back."""
    texts = [str(r.get("completion", "")) for r in others]
    return {rid: [x for x in spans if not any(leaked_secrets([x], t) for t in texts)] for rid, spans in secrets.items()}


def regressed(now: list[dict], own: list[dict], leak: str) -> list[int]:
    """The earlier sets (numbered from 1) whose exact match or `leak` is above its figure right after its own
    erasure."""
    return [j + 1 for j, e in enumerate(now) if e["exact_match"] > own[j]["exact_match"] or e[leak] > own[j][leak]]


def sequential_records() -> tuple[list[dict], list[dict], list[dict]]:
    """The fixture's 400 QA, the 60 world facts kept in the model's retain set, and the 57 no retain term holds (the
    utility set)."""
    facts = world_facts()
    return tofu_records(range(180, 200)), facts[:60], facts[60:]


def audited_utility(report: dict) -> dict:
    """A job's own audit of the utility set: the new version beside the one it started from."""
    section = report["audit"]["utility_set"]
    return {"after": section.get("value"), "before": section.get("base_value")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_sequential")
    parser.add_argument("--anchor", choices=("default", "previous"), default="default")
    parser.add_argument("--requests", type=int, default=len(PAIRS))
    parser.add_argument("--preset", default=None, help="a MASC preset every job names (default: none, the default job)")
    args = parser.parse_args(argv)
    pairs = PAIRS[:args.requests]
    # A comparison or a shorter run writes results and a block of its own, never over the full default run's.
    name = "sequential" + ("-anchor-previous" if args.anchor == "previous" else "") + \
        (f"-preset-{args.preset}" if args.preset else "") + \
        (f"-{len(pairs)}-requests" if len(pairs) != len(PAIRS) else "")
    command = COMMAND if args.anchor == "default" and args.requests == len(PAIRS) and not args.preset else \
        f"python -m bench.bench_sequential {' '.join(argv if argv is not None else sys.argv[1:])}"
    partial = RESULTS.with_name(f"{name}.partial.json")
    source = fixture("sequential", log=lambda line: print(line, file=sys.stderr))
    tofu, kept_facts, utility_set = sequential_records()
    sets = [tofu_records(range(a, b + 1)) for a, b in pairs]
    erased_ids = lambda upto: {r["id"] for s in sets[:upto] for r in s}  # noqa: E731
    secrets, distinctive = set_secrets(sets, tofu, kept_facts + utility_set)
    base = Measurer(source)
    base_erased = [base.erased(s, secrets[i], distinctive[i]) for i, s in enumerate(sets)]
    base_utility = base.utility(utility_set)
    service = Service(source.parent)
    rows, together = [], {}
    try:
        model = service.register("sequential", source, tofu + kept_facts, utility_set)
        after_own: list[dict] = []
        for i, pair in enumerate(pairs):
            if args.anchor == "previous":  # the version this request starts from: the head
                head = service.client.get(f"/v1/models/{model}").json()["latest_version"]
                service.client.patch(f"/v1/models/{model}", json={"anchor_version": head}).raise_for_status()
            started = time.perf_counter()
            job = service.wait(service.submit(model, f"seq-{i + 1}", sets[i], args.preset))
            seconds = time.perf_counter() - started
            measured = Measurer(service.download(model, job["result"]["model_version"]))
            report = service.report(job["id"])
            retain_now = [r for r in tofu if r["id"] not in erased_ids(i + 1)] + kept_facts
            sample = random.Random(i).sample(retain_now, min(RETAIN_SAMPLE, len(retain_now)))
            earlier = [measured.erased(s, secrets[j], distinctive[j]) for j, s in enumerate(sets[:i + 1])]
            after_own.append(earlier[i])
            rows.append({
                "request": i + 1, "authors": list(pair), "version": job["result"]["model_version"],
                "seconds": round(seconds, 1), "stop_reason": job["result"]["stop_reason"],
                "steps": job["result"]["steps"], "forgotten": report["verdict"]["forgotten"],
                "exact_match": round(earlier[i]["exact_match"], 3), "leak_greedy": round(earlier[i]["leak_greedy"], 3),
                "leak_distinctive": round(earlier[i]["leak_distinctive"], 3),
                "earlier_exact_match": [round(e["exact_match"], 3) for e in earlier[:i]],
                "earlier_leak_greedy": [round(e["leak_greedy"], 3) for e in earlier[:i]],
                "earlier_leak_distinctive": [round(e["leak_distinctive"], 3) for e in earlier[:i]],
                "earlier_regressed": regressed(earlier[:i], after_own, "leak_distinctive"),
                "earlier_regressed_raw": regressed(earlier[:i], after_own, "leak_greedy"),
                "earlier_leaking_distinctive": [e["leaking_distinctive"] for e in earlier[:i]],
                "retain_exact_match": round(measured.retain_exact_match(sample), 3),
                "base_retain_exact_match": round(base.retain_exact_match(sample), 3),
                "utility": measured.utility(utility_set), "base_utility": base_utility,
                "audited_utility": audited_utility(report),
                "answers": earlier[i]["answers"]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "answers"}), flush=True)
            # A run cut short (hours on a CPU) still leaves its rows; the full results replace them at the end.
            partial.write_text(json.dumps({"command": command, "partial": True, "base_erased": base_erased,
                                           "rows": rows}, indent=2) + "\n")

        model_together = service.register("together", source, tofu + kept_facts, utility_set)
        started = time.perf_counter()
        ids = [service.submit(model_together, f"together-{i + 1}", s, args.preset) for i, s in enumerate(sets)]
        jobs = [service.wait(j) for j in ids]
        seconds = time.perf_counter() - started
        last = max(j["result"]["model_version"] for j in jobs)
        measured = Measurer(service.download(model_together, last))
        final = [measured.erased(s, secrets[j], distinctive[j]) for j, s in enumerate(sets)]
        together = {"seconds": round(seconds, 1), "one_request_seconds": rows[0]["seconds"],
                    "ratio": round(seconds / rows[0]["seconds"], 2),
                    "runs": len({j["run_id"] or j["id"] for j in jobs}),
                    "versions": sorted({j["result"]["model_version"] for j in jobs}),
                    "forgotten": [service.report(j)["verdict"]["forgotten"] for j in ids],
                    "exact_match": [round(e["exact_match"], 3) for e in final],
                    "leak_greedy": [round(e["leak_greedy"], 3) for e in final],
                    "leak_distinctive": [round(e["leak_distinctive"], 3) for e in final],
                    "retain_exact_match": round(measured.retain_exact_match(kept_facts), 3),
                    "base_retain_exact_match": round(base.retain_exact_match(kept_facts), 3),
                    "utility": measured.utility(utility_set)}
        print(json.dumps(together), flush=True)
    finally:
        service.stop()
    checks = {
        "utility >= 95 % of the base's after every request": all(r["utility"] >= 0.95 * r["base_utility"]
                                                                 for r in rows),
        "retain exact match >= 95 % of the base's after every request": all(
            r["retain_exact_match"] >= 0.95 * r["base_retain_exact_match"] for r in rows),
        "no earlier set's exact match or distinctive-secret leakage above its own erasure's": not any(
            r["earlier_regressed"] for r in rows),
        "(for reference) no earlier set's leakage of any extracted secret above its own erasure's": not any(
            r["earlier_regressed_raw"] for r in rows),
        "ten together in at most 3x one request's time": together["ratio"] <= 3.0,
        "each request its own verdict": len(together["forgotten"]) == len(sets),
    }
    for check, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {check}")
    results = RESULTS.with_name(f"{name}.json")
    results.write_text(json.dumps({"command": command, "machine": f"{platform.machine()}, CPU",
                                   "base_erased": base_erased, "rows": rows, "together": together,
                                   "checks": checks}, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    update_benchmarks(name, table(rows, together, checks, command, results.name, args.preset))
    print(f"written to {results.relative_to(ROOT)} and BENCHMARKS.md")


def table(rows: list[dict], together: dict, checks: dict, command: str, results: str,
          preset: str | None = None) -> str:
    job = f"Every job with the preset {preset}" if preset else "Default job (no parameters)"
    lines = [f"### Requests in a row, then all at once: `{command}`", "",
             f"Measured on {platform.machine()} (2 threads), CPU; raw figures and three answers per request in "
             f"`bench/results/{results}`. {job}, audit without quantisation and "
             "relearning. Retain EM: a seeded sample of 100 of the model's retain set at that point, beside the "
             "base's on the same sample; utility: model utility on 57 world facts never in a retain set. Leak: greedy "
             "secret leakage of every extracted secret, in brackets of the distinctive ones alone (those no record "
             "outside the set says: `distinctive_secrets`); an earlier set is above its own erasure when its exact "
             "match or distinctive leak is.", "",
             "| request | authors | s | stop | steps | verdict | EM | leak (distinctive) | worst earlier EM "
             "| worst earlier leak (distinctive) "
             "| earlier sets above their own erasure | retain EM (base) | utility (base) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        worst_em = max(r["earlier_exact_match"], default=None)
        worst_leak = max(r["earlier_leak_greedy"], default=None)
        worst_distinctive = max(r.get("earlier_leak_distinctive", []), default=None)
        lines.append(f"| {r['request']} | {r['authors'][0]}-{r['authors'][1]} | {r['seconds']} | {r['stop_reason']} "
                     f"| {r['steps']} | {'Forgotten' if r['forgotten'] else 'Not established'} | {r['exact_match']} "
                     f"| {r['leak_greedy']} ({r.get('leak_distinctive')}) | {'' if worst_em is None else worst_em} "
                     f"| {'' if worst_leak is None else f'{worst_leak} ({worst_distinctive})'} "
                     f"| {r['earlier_regressed'] or 'none'} "
                     f"| {r['retain_exact_match']} ({r['base_retain_exact_match']}) "
                     f"| {r['utility']} ({r['base_utility']}) |")
    t = together
    lines += ["", f"{len(t['forgotten'])} at once: {t['seconds']} s against {t['one_request_seconds']} s for one "
              "request "
              f"(ratio {t['ratio']}), {t['runs']} run(s), versions {t['versions']}; verdicts "
              f"{sum(t['forgotten'])}/{len(t['forgotten'])} Forgotten; EM per set {t['exact_match']}, leak "
              f"{t['leak_greedy']} (distinctive {t.get('leak_distinctive')}); "
              f"retain EM on the kept world facts {t['retain_exact_match']} (base "
              f"{t['base_retain_exact_match']}); utility {t['utility']}.", ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {check}" for check, ok in checks.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
