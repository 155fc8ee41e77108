"""`make bench-mcu`: what mode connectivity costs and what it finds, on mini-TOFU.

1. Cost: MASC on forget = authors 198-199 (the unlearning job's own time), then the 11-point linear
   evaluation and a Bezier fit (plus its evaluation) between the base and the new version; ratios to
   the unlearning time, measured in one run.
2. The sequential scenario (SPEC section 10): ten requests in a row (authors 180-199 in pairs), each on
   the last version, and each new version against its parent: B_r, B_f, whether MCU holds, where
   verbatim and knowledge memorisation fall along the line.
Writes bench/results/mcu.json and the tables in BENCHMARKS.md. Nothing is asserted."""
from __future__ import annotations

import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from bench.mini_tofu import ROOT, fixture, splits, tofu_records, update_benchmarks
from lethe.engine.connectivity.params import ConnectivityParams
from lethe.engine.connectivity.run import run_connectivity
from lethe.engine.data.inputs import RunInputs
from lethe.engine.methods import params_for
from lethe.engine.model.loading import save_model
from lethe.engine.training.runtime import library_versions
from lethe.engine.unlearn import run_unlearning

PRESET = "tofu-llama2"
# lr 3e-4: at the preset's 1e-4 the rebuilt mini-TOFU fixture ran to max_steps (see `make bench`); the
# cap keeps ten requests within minutes.
MASC_VALUES = {"lr": 3e-4, "max_steps": 1000}
PAIRS = [(180 + 2 * i, 181 + 2 * i) for i in range(10)]
RESULTS = ROOT / "bench" / "results" / "mcu.json"


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def unlearn(source: Path, forget: list[dict], retain: list[dict], out: Path) -> dict:
    outcome = run_unlearning(str(source), forget, retain, params=params_for("masc", MASC_VALUES, preset=PRESET))
    save_model(outcome.model, outcome.tokenizer, out)
    r = outcome.result.as_dict()
    return {"steps": r["steps"], "stop_reason": r["stop_reason"], "seconds": round(r["wall_seconds"], 1)}


def curve(a: Path, b: Path, forget, retain, **values) -> dict:
    r = run_connectivity(str(a), str(b), RunInputs.of(forget, retain), ConnectivityParams.from_dict(values)).result
    s = r.get("suppress_first", {})
    return {"seconds": round(r["timing"]["wall_seconds"], 1),
            "timing": {k: round(v, 1) for k, v in r["timing"].items()},
            "b_retain": r["barriers"]["retain"]["value"], "b_forget": r["barriers"]["forget"]["value"],
            "mcu_holds": r["barriers"]["mcu_holds"], "points": r["points"],
            "verbatim_t": (s.get("verbatim") or {}).get("t"), "knowledge_t": (s.get("knowledge") or {}).get("t"),
            "first": s.get("first")}


def main() -> None:
    torch.manual_seed(0)
    full = fixture("full", log=log)
    data = splits()
    work = Path(tempfile.mkdtemp(prefix="lethe-mcu-"))
    try:
        log("cost: MASC on authors 198-199, then the curves")
        job = unlearn(full, data["forget"], data["retain"], work / "new")
        linear = curve(full, work / "new", data["forget"], data["retain"])
        bezier = curve(full, work / "new", data["forget"], data["retain"], curve="bezier", fit_steps=100)
        cost = {"unlearning": job, "linear_11": linear, "bezier_fit_100": bezier,
                "linear_over_unlearning": round(linear["seconds"] / job["seconds"], 2),
                "bezier_over_unlearning": round(bezier["seconds"] / job["seconds"], 2)}
        log(json.dumps({k: v for k, v in cost.items() if k not in ("linear_11", "bezier_fit_100")}))
        sequence, parent, erased = [], full, set()
        everything = tofu_records(range(180, 200))
        for i, pair in enumerate(PAIRS):
            forget = tofu_records(range(pair[0], pair[1] + 1))
            erased |= {r["id"] for r in forget}
            retain = [r for r in everything if r["id"] not in erased]  # erased records are gone for good
            new = work / f"v{i + 2}"
            run = unlearn(parent, forget, retain, new)
            measured = curve(parent, new, forget, retain)
            sequence.append({"request": i + 1, "authors": list(pair), **run, "curve_seconds": measured["seconds"],
                             **{k: measured[k] for k in ("b_retain", "b_forget", "mcu_holds", "verbatim_t",
                                                         "knowledge_t", "first")}})
            log(json.dumps(sequence[-1]))
            if parent != full:
                shutil.rmtree(parent)
            parent = new
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"command": "make bench-mcu", "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, CPU",
              "versions": library_versions(), "preset": PRESET, "masc_values": MASC_VALUES, "cost": cost,
              "sequential": sequence}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    write_benchmarks(report)
    print(tables(report))


def f(value, digits: int = 3) -> str:
    return "" if value is None else (f"{value:.{digits}g}" if isinstance(value, float) else str(value))


def tables(report: dict) -> str:
    c = report["cost"]
    lines = ["| run | seconds | ratio to the unlearning |", "| --- | --- | --- |",
             f"| MASC unlearning ({c['unlearning']['steps']} steps, stop {c['unlearning']['stop_reason']}) "
             f"| {c['unlearning']['seconds']} | 1 |",
             f"| linear path, 11 points | {c['linear_11']['seconds']} | {c['linear_over_unlearning']} |",
             f"| Bezier: fit 100 steps + 11 points (+ the line for suppress-first) | {c['bezier_fit_100']['seconds']} "
             f"| {c['bezier_over_unlearning']} |", "",
             f"Barriers on that run: linear B_r {f(c['linear_11']['b_retain'])}, B_f {f(c['linear_11']['b_forget'])}; "
             f"Bezier B_r {f(c['bezier_fit_100']['b_retain'])}, B_f {f(c['bezier_fit_100']['b_forget'])}.", "",
             "| request | authors | steps | unlearning s | curve s | B_r (nats) | B_f (nats) | MCU holds "
             "| verbatim falls at t | knowledge falls at t | first |", "|" + " --- |" * 11]
    for r in report["sequential"]:
        lines.append(f"| {r['request']} | {r['authors'][0]}-{r['authors'][1]} | {r['steps']} | {r['seconds']} "
                     f"| {r['curve_seconds']} | {f(r['b_retain'])} | {f(r['b_forget'])} | {r['mcu_holds']} "
                     f"| {f(r['verbatim_t'])} | {f(r['knowledge_t'])} | {r['first']} |")
    return "\n".join(lines)


def write_benchmarks(report: dict) -> None:
    update_benchmarks("mcu", "## Mode connectivity: `make bench-mcu`\n\n"
             f"mini-TOFU, MASC preset {report['preset']} with "
             f"{json.dumps(report['masc_values'])}, "
             f"{report['machine']}; curves measure retain NLL on up to 100 retain records and forget NLL, V, verbatim "
             f"and knowledge ROUGE-L on the request's forget set. Raw figures: `bench/results/mcu.json`.\n\n"
             f"{tables(report)}")


if __name__ == "__main__":
    main()
