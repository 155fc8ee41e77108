"""`make bench-audit`: the default audit's wall time against the unlearning it audits, on the
mini-TOFU fixture (forget authors 198-199, holdout non-members authors 170-171). Writes
bench/results/audit.json; nothing is asserted."""
from __future__ import annotations

import json
import platform
import sys
import time

import torch

from bench.mini_tofu import ROOT, fixture, splits, tofu_records
from lethe.engine.audit.run import run_audit
from lethe.engine.data.inputs import RunInputs
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.training.runtime import library_versions
from lethe.engine.unlearn import run_unlearning

PRESET = "tofu-llama2"
RESULTS = ROOT / "bench" / "results" / "audit.json"


def main() -> None:
    torch.manual_seed(0)
    model_dir = fixture("full", log=lambda line: print(line, file=sys.stderr))
    data = splits()
    holdout = tofu_records(range(170, 172))  # authors the fixture never saw
    outcome = run_unlearning(str(model_dir), data["forget"], data["retain"],
                             params=MascParams.from_dict({"max_steps": 1000}, preset=PRESET), device="cpu")
    started = time.perf_counter()
    report = run_audit(str(model_dir), outcome.model, outcome.tokenizer,
                       RunInputs.of(data["forget"], data["retain"], holdout))
    audit_seconds = time.perf_counter() - started
    unlearn_seconds = outcome.result.as_dict()["wall_seconds"]
    summary = {
        "command": "make bench-audit", "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, CPU",
        "versions": library_versions(), "preset": PRESET, "stop_reason": outcome.result.as_dict()["stop_reason"],
        "steps": outcome.result.as_dict()["steps"], "unlearning_wall_seconds": round(unlearn_seconds, 2),
        "audit_wall_seconds": round(audit_seconds, 2), "ratio": round(audit_seconds / unlearn_seconds, 3),
        "audit_parts_seconds": {k: round(v, 2) for k, v in report["timing_seconds"].items()},
        "sets": report["sets"],
        "headline": {
            "forget_exact_match": [report["before"]["forget_verbatim"]["exact_match"]["value"],
                                   report["after"]["forget_verbatim"]["exact_match"]["value"]],
            "forget_rouge_l_recall": [report["before"]["forget_verbatim"]["rouge_l_recall"]["value"],
                                      report["after"]["forget_verbatim"]["rouge_l_recall"]["value"]],
            "model_utility": [report["before"]["retain_utility"]["model_utility"]["value"],
                              report["after"]["retain_utility"]["model_utility"]["value"]],
            "mia_auc_loss": [report["before"]["membership"]["loss"]["value"],
                             report["after"]["membership"]["loss"]["value"]],
            "quantized_forget_exact_match": report["quantization"]["forget_verbatim"]["exact_match"]["value"],
            "relearning_rouge_l_recall": [p["rouge_l_recall"] for p in report["relearning"]["points"]],
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"unlearning ({PRESET}): {summary['stop_reason']} after {summary['steps']} steps, {unlearn_seconds:.1f} s")
    print(f"default audit (quantisation and relearning included): {audit_seconds:.1f} s = "
          f"{summary['ratio']:.2f}x the unlearning (target <= 2x)")
    print("audit parts (s): " + ", ".join(f"{k} {v}" for k, v in summary["audit_parts_seconds"].items()))
    for key, value in summary["headline"].items():
        print(f"  {key}: {value}")
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
