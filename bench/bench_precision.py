"""`make bench-precision`: one MASC job (the published TOFU preset) on mini-TOFU in every precision mode, side by
side: peak tensor memory (weights, adapters, gradients, optimiser state, activations; counted by
lethe.engine.training.runtime.TensorMemory, the CPU's counterpart of CUDA's allocator peak), its ratio to today's
float32 LoRA path, step time, the memory plan's estimate beside it, and the forgetting figures. float32 and bfloat16
LoRA run with three seeds each, so that the noise between seeds can be told from a difference between modes. Writes
bench/results/precision.json and the table in BENCHMARKS.md. Nothing is asserted.

    python -m bench.bench_precision [--seeds 3] [--quick]
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time

import torch

from bench.bench_methods import measure
from bench.mini_tofu import ROOT, fixture, loaded, update_benchmarks
from lethe.engine.audit.measurements import evaluate
from lethe.engine.methods import params_for
from lethe.engine.model.loading import load_model
from lethe.engine.training.runtime import TensorMemory, library_versions
from lethe.engine.unlearn import run_unlearning

PRESET = "tofu-llama2"
MODES = [  # (label, parameters)
    ("LoRA float32 (before this change)", {"dtype": "float32"}),
    ("LoRA bfloat16", {"dtype": "bfloat16"}),
    ("LoRA bfloat16 + gradient checkpointing", {"dtype": "bfloat16", "gradient_checkpointing": True}),
    ("full float32", {"dtype": "float32", "lora": False}),
    ("full bfloat16 (mixed)", {"dtype": "bfloat16", "lora": False}),
    ("full bfloat16 (mixed) + gradient checkpointing", {"dtype": "bfloat16", "lora": False,
                                                        "gradient_checkpointing": True}),
]
REPEATED = {"LoRA float32 (before this change)", "LoRA bfloat16"}


def run_mode(full, data, values: dict, seed: int) -> tuple[dict, object]:
    params = params_for("masc", {"max_steps": 2000, **values, "seed": seed}, preset=PRESET)
    gc.collect()
    with TensorMemory() as tensors:
        started = time.perf_counter()
        outcome = run_unlearning(str(full), data["forget"], data["retain"], params=params, device="cpu")
        wall = time.perf_counter() - started
    r = outcome.result.as_dict()
    row = {"stop_reason": r["stop_reason"], "steps": r["steps"], "wall_seconds": round(wall, 1),
           "step_ms": round(1000 * r["timing"]["loop_seconds"] / max(1, r["steps"]), 1),
           "peak_tensor_mib": round(tensors.peak / 2**20, 2),
           "estimate_mib": round(r["peak_memory"]["estimate_bytes"] / 2**20, 2),
           "v_all_forget": r["final_violation_rate"],
           "precision": r["precision"]}
    return row, outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one seed, LoRA float32 and bfloat16 only")
    args = parser.parse_args()
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    torch.manual_seed(0)
    full, base, tokenizer, data, sets = loaded(log)
    ref_model, _ = load_model(fixture("retain", log=log), torch.device("cpu"))
    ref_tr = list(evaluate(ref_model, tokenizer, sets["forget"], None, None)["forget_truth_ratio_raw"].values())
    del ref_model, base
    modes = MODES[:2] if args.quick else MODES
    rows = []
    for label, values in modes:
        for seed in range(args.seeds if label in REPEATED and not args.quick else 1):
            log(f"running {label}, seed {seed}")
            row, outcome = run_mode(full, data, values, seed)
            row = {"mode": label, "seed": seed, **row, **measure(outcome.model, tokenizer, sets, ref_tr)}
            rows.append(row)
            log(json.dumps(row))
            del outcome
            gc.collect()
    baseline = statistics.mean(r["peak_tensor_mib"] for r in rows if r["mode"] == modes[0][0])
    for row in rows:
        row["tensor_ratio_to_lora_float32"] = round(row["peak_tensor_mib"] / baseline, 3)
    report = {"command": "python -m bench.bench_precision" + (" --quick" if args.quick else ""),
              "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, CPU", "preset": PRESET,
              "versions": library_versions(), "rows": rows}
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "precision.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    if not args.quick:
        update_benchmarks("precision", table(rows))


def table(rows: list[dict]) -> str:
    head = ("| mode | seed | stop | steps | step ms | peak tensor MiB | ratio | estimate MiB | forget EM | forget "
            "ROUGE-L | truth ratio | forget quality | model utility |\n" + "|---" * 13 + "|")
    lines = [f"| {r['mode']} | {r['seed']} | {r['stop_reason']} | {r['steps']} | {r['step_ms']} | "
             f"{r['peak_tensor_mib']} | {r['tensor_ratio_to_lora_float32']} | {r['estimate_mib']} | "
             f"{r['forget_exact_match']:.3g} | {r['forget_rouge_l']:.3g} | {r['forget_truth_ratio']:.3g} | "
             f"{r['forget_quality']:.3g} | {r['model_utility']:.3g} |" for r in rows]
    return "\n".join([head, *lines])


if __name__ == "__main__":
    main()
