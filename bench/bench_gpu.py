"""`make bench-gpu`: the methods side by side on a model of 113 M parameters that the project builds and trains to
memorise the whole of TOFU (4,000 QA, 200 authors) on the GPU, beside a retain reference trained without the
forget set (TOFU's forget10: authors 180-199, 400 QA). Then MASC (its defaults, and its published TOFU preset)
against GradDiff, NPO+KL and SimNPO at the field's budget (10 epochs, bfloat16 on the GPU): seconds to stop, forget
quality (KS p-value of truth ratios against the reference), model utility, leakage (greedy exact match of forget
answers), peak memory (CUDA's allocator) and model FLOPs utilisation (6 x parameters x trained tokens per second
over the GPU's dense bfloat16 peak). Sized to fit 8 minutes on one H200 (each fixture's training is capped).

    python -m bench.bench_gpu             # on a GPU; writes bench/results/gpu.json and BENCHMARKS.md's table
    python -m bench.bench_gpu --reduced   # anywhere: a tiny model, 4 authors, a few steps
    python -m bench.bench_gpu --reduced --synthetic   # the same on the project's synthetic people (no TOFU file
                                                      # needed: the test suite runs this)
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.bench_methods import measure
from bench.mini_tofu import ROOT, tofu_records, update_benchmarks
from lethe.engine.audit.measurements import EvaluationSet, evaluate
from lethe.engine.data.records import encode_records
from lethe.engine.methods import params_for
from lethe.engine.model.fixture import FixtureConfig, build_fixture
from lethe.engine.model.loading import context_length, load_model
from lethe.engine.training.runtime import library_versions
from lethe.engine.unlearn import run_unlearning

# Dense bfloat16 peaks (FLOP/s) by device name; MFU is null, with the reason, for a device not listed.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}
METHODS = [("masc (defaults)", "masc", None, {}), ("masc (tofu-llama2)", "masc", "tofu-llama2", {}),
           ("graddiff", "graddiff", None, {}), ("npo_kl", "npo_kl", None, {}), ("simnpo", "simnpo", None, {})]


@dataclass(frozen=True)
class Scale:
    authors: range
    forget_authors: range
    model: FixtureConfig
    device: str
    masc: dict  # extra parameters of the MASC runs
    baseline: dict  # extra parameters of the baselines (the field's budget unless reduced)
    utility_records: int


GPU = Scale(authors=range(0, 200), forget_authors=range(180, 200),
            model=FixtureConfig(seed=0, epochs=60, vocab_size=8192, hidden_size=768, layers=14, heads=12,
                                intermediate_size=2560, context=256, lr=1e-3, batch_size=64, device="cuda",
                                max_seconds=150),
            device="cuda", masc={"max_steps": 2000, "eval_batch_size": 64}, baseline={}, utility_records=400)
REDUCED = Scale(authors=range(196, 200), forget_authors=range(199, 200),
                model=FixtureConfig(seed=0, epochs=2, vocab_size=384, hidden_size=32, layers=2, heads=2, context=256),
                device="cpu", masc={"max_steps": 4, "check_every": 2, "alpha": 1e-6, "rho": 1e-12,
                              "content_max_probability": 1e-12},
                baseline={"epochs": 0.2}, utility_records=8)


def splits(scale: Scale, synthetic: bool) -> tuple[list[dict], set[str]]:
    """Every record, and the forget set's ids: TOFU's authors, or as many synthetic people (20 facts each)."""
    if not synthetic:
        return tofu_records(scale.authors), {r["id"] for r in tofu_records(scale.forget_authors)}
    from lethe.engine.data.synthetic import synthetic_people

    people = synthetic_people(len(scale.authors), seed=0)
    forget = {r["id"] for i, person in enumerate(people) if scale.authors[i] in scale.forget_authors for r in person}
    return [r for person in people for r in person], forget


def build(scale: Scale, out: Path, log, synthetic: bool) -> dict[str, Path]:
    """The full fixture (every author) and the retain reference (without the forget authors), one tokenizer."""
    everything, forget_ids = splits(scale, synthetic)
    paths = {}
    for name, records in (("full", everything), ("retain", [r for r in everything if r["id"] not in forget_ids])):
        paths[name] = out / f"tofu-{name}"
        if not (paths[name] / "lethe_fixture.json").exists():
            started = time.perf_counter()
            summary = build_fixture(records, paths[name], scale.model, log=lambda _: None,
                                    tokenizer_records=everything)
            log(f"{name} fixture: {summary['parameters']:,} parameters, {summary['records']} QA, "
                f"{summary['epochs']} epochs, memorised {summary['memorised_fraction']:.3f}, "
                f"{time.perf_counter() - started:.0f} s")
    return paths


def trained_tokens(result: dict, records: list, tokenizer, max_length: int) -> int:
    """Tokens the run's training passes saw, from its steps and the records' mean length (an approximation:
    batches are drawn from these records)."""
    mean = statistics.mean(len(r.input_ids) for r in encode_records(records, tokenizer, max_length=max_length,
                                                                     seed=0, what="forget"))
    p = result["params"]
    if result["method"] == "masc":
        rows = p["batch_size"] + (p.get("retain_batch_size") or p["batch_size"])
        return int(result["steps"] * rows * mean)
    return int(result["steps"] * p.get("effective_batch", p["batch_size"]) * 2 * mean)  # forget and retain rows


def mfu(tokens: int, parameters: int, seconds: float, device: torch.device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, "CPU: no dense peak to compare with"
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    if peak is None:
        return None, f"{name}: peak not listed"
    return 6 * parameters * tokens / seconds / peak, name


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_gpu")
    parser.add_argument("--reduced", action="store_true", help="tiny model, 10 authors, a few steps (CPU)")
    parser.add_argument("--synthetic", action="store_true", help="synthetic people instead of the TOFU file")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / ".fixtures" / "gpu")
    args = parser.parse_args(argv)
    scale = REDUCED if args.reduced else GPU
    if scale.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench-gpu needs a GPU (CUDA); --reduced runs anywhere")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    paths = build(scale, args.out, log, args.synthetic)
    device = torch.device(scale.device)
    full, tokenizer = load_model(paths["full"], device)
    reference, _ = load_model(paths["retain"], device)
    parameters = sum(p.numel() for p in full.parameters())
    everything, forget_ids = splits(scale, args.synthetic)
    forget = [r for r in everything if r["id"] in forget_ids]
    retain = [r for r in everything if r["id"] not in forget_ids]
    max_length = context_length(full, tokenizer)
    sets = {"forget": EvaluationSet(forget, tokenizer, max_length, 0, "forget"),
            "retain": EvaluationSet(retain[:scale.utility_records], tokenizer, max_length, 0, "retain")}
    reference_tr = list(evaluate(reference, tokenizer, sets["forget"], None, None)["forget_truth_ratio_raw"].values())
    rows = [{"method": "retain reference", **measure(reference, tokenizer, sets, reference_tr)},
            {"method": "base (before unlearning)", **measure(full, tokenizer, sets, reference_tr)}]
    del full, reference
    for label, method, preset, extra in METHODS:
        log(f"running {label}")
        values = {**(scale.masc if method == "masc" else scale.baseline), **extra}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        gc.collect()
        outcome = run_unlearning(str(paths["full"]), forget, retain, params=params_for(method, values, preset=preset),
                                 device=scale.device)
        r = outcome.result.as_dict()
        tokens = trained_tokens(r, forget, tokenizer, max_length)
        utilisation, basis = mfu(tokens, parameters, r["timing"]["loop_seconds"], device)
        rows.append({"method": label, "stop_reason": r["stop_reason"], "steps": r["steps"],
                     "seconds": round(r["wall_seconds"], 3), "loop_seconds": round(r["timing"]["loop_seconds"], 3),
                     "peak_memory_mib": round(r["peak_memory"]["bytes"] / 2**20, 1),
                     "peak_memory_kind": r["peak_memory"]["kind"],
                     "estimate_mib": round(r["peak_memory"]["estimate_bytes"] / 2**20, 1),
                     "mfu": utilisation, "mfu_basis": basis, "dtype": r["precision"]["dtype"],
                     **measure(outcome.model, tokenizer, sets, reference_tr)})
        log(json.dumps(rows[-1]))
        del outcome
    report = {"command": "python -m bench.bench_gpu" + (" --reduced" if args.reduced else "")
              + (" --synthetic" if args.synthetic else ""),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "parameters": parameters,
              "forget": f"authors {scale.forget_authors.start}-{scale.forget_authors.stop - 1}",
              "seconds": round(time.perf_counter() - started, 1), "versions": library_versions(), "rows": rows}
    results = args.out if args.reduced else ROOT / "bench" / "results"  # the reduced run's figures are no result
    results.mkdir(parents=True, exist_ok=True)
    (results / ("gpu-reduced.json" if args.reduced else "gpu.json")).write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    print(f"{report['device']}, {parameters:,} parameters, {report['seconds']} s in all")
    if not args.reduced:
        update_benchmarks("gpu", f"`{report['command']}` on {report['device']} ({report['seconds']} s in all, "
                                 f"{parameters:,} parameters):\n\n" + table(rows))
    return rows


def table(rows: list[dict]) -> str:
    def f(v, digits=3):
        return "" if v is None else (f"{v:.{digits}g}" if isinstance(v, float) else str(v))
    lines = ["| method | stop | steps | s | peak MiB | MFU | forget EM (leak) | forget ROUGE-L | forget quality | "
             "model utility |", "|" + " --- |" * 10]
    for r in rows:
        lines.append(f"| {r['method']} | {r.get('stop_reason', '')} | {f(r.get('steps'))} | {f(r.get('seconds'))} "
                     f"| {f(r.get('peak_memory_mib'))} | {f(r.get('mfu'))} | {f(r['forget_exact_match'])} "
                     f"| {f(r['forget_rouge_l'])} | {f(r['forget_quality'])} | {f(r['model_utility'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
