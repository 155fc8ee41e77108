"""One request of `make bench-sequential` on the engine alone (no service): authors 180-181 erased from the
sequential fixture, the model's retain set as there (the other 380 QA and 60 world facts), with parameter
overrides, to compare settings on what issue 28 measures: the erased set's exact match and greedy leakage against
the collateral (exact match on a seeded 100 of the retain set; model utility on the 57 world facts no retain term
protects), and the utility facts whose greedy answers it changed. Prints one JSON line; nothing is written to the
repository.

    python -m bench.bench_one_request                                  # the default job
    python -m bench.bench_one_request --params '{"escalate_after": 0}'  # the forget weight never raised
    python -m bench.bench_one_request --forget-weight-ceiling 1       # raised to 1 at most (the same as
                                                                      # --params '{"lambda_forget_max": 1}')
    python -m bench.bench_one_request --authors 186 187               # another pair (the fourth request's)
    python -m bench.bench_one_request --result run.json               # and the run's traces, to read its tail"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time

from bench.bench_sequential import Measurer, sequential_records
from bench.mini_tofu import fixture, tofu_records
from lethe.engine.audit.extraction import request_secrets
from lethe.engine.methods import get_method
from lethe.engine.unlearn import run_unlearning


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_one_request")
    parser.add_argument("--params", default="{}", help="MASC parameters as JSON (the default job: none)")
    parser.add_argument("--forget-weight-ceiling", type=float, default=None,
                        help="the escalation's ceiling for lambda_forget: lambda_forget_max (the default's is 0.1)")
    parser.add_argument("--authors", type=int, nargs=2, default=(180, 181), metavar=("FIRST", "SECOND"),
                        help="the two TOFU authors erased (the sequential benchmark's first request: 180 181)")
    parser.add_argument("--result", default=None, metavar="FILE",
                        help="also write the run's whole result (v_trace, loss_trace, per-record checks) as JSON")
    args = parser.parse_args(argv)
    overrides = json.loads(args.params)
    if args.forget_weight_ceiling is not None:
        overrides["lambda_forget_max"] = args.forget_weight_ceiling
    source = fixture("sequential", log=lambda line: print(line, file=sys.stderr))
    tofu, kept, utility_set = sequential_records()
    forget = tofu_records(args.authors)
    erased = {r["id"] for r in forget}
    retain = [r for r in tofu if r["id"] not in erased] + kept
    secrets = request_secrets(forget, [r for r in tofu if r["id"] not in erased])
    started = time.perf_counter()
    outcome = run_unlearning(str(source), forget, retain, params=get_method("masc").parse(overrides))
    seconds = time.perf_counter() - started
    result = outcome.result.as_dict()
    if args.result:
        with open(args.result, "w") as out:
            json.dump(result, out)
    sample = random.Random(0).sample(retain, 100)
    base = Measurer(source)
    with tempfile.TemporaryDirectory() as folder:
        outcome.model.save_pretrained(folder)
        outcome.tokenizer.save_pretrained(folder)
        after = Measurer(folder)
        own = after.erased(forget, secrets)
        print(json.dumps({
            "authors": list(args.authors), "params": overrides, "forget_weight_ceiling": args.forget_weight_ceiling,
            "seconds": round(seconds, 1), "stop_reason": result["stop_reason"],
            "steps": result["steps"], "escalations": result.get("escalations", []),
            "records_meeting": sum(r["meets_condition"] for r in result.get("per_record") or []),
            "exact_match": own["exact_match"], "leak_greedy": own["leak_greedy"],
            "retain_exact_match": after.retain_exact_match(sample), "base_retain_exact_match":
                base.retain_exact_match(sample),
            "utility": after.utility_parts(utility_set), "base_utility": base.utility_parts(utility_set),
            "utility_answers_changed": changed_answers(base.answers(utility_set), after.answers(utility_set)),
            "answers": own["answers"]}))


def changed_answers(before: dict[str, str], after: dict[str, str], shown: int = 10) -> dict:
    """The utility facts whose greedy answer the run changed: how many, and the first `shown` of them."""
    changed = [rid for rid in before if after[rid] != before[rid]]
    return {"count": len(changed), "of": len(before),
            "first": [{"id": rid, "base": before[rid], "after": after[rid]} for rid in changed[:shown]]}


if __name__ == "__main__":
    main()
