"""One request of the chain (bench.bench_chain) run alone from the root: what erasing its pair costs by itself, apart
from what the versions before it drifted. `--retain chain` keeps the retain set the chain has at that request (the
sets before it neither retained nor erased: only the records a governance system would still hold), `--retain full`
every record but the pair's. `--start` runs it from a chain's version instead (its retain term on that start), and
`--more-retain` adds the first half of the unprotected world facts to the retain set, utility then read on the other
half only: whether more retained text of that kind holds facts no term names. One JSON line; the version is kept where
`--version` names a folder.

    python -m bench.bench_alone --request 9 --retain chain
    python -m bench.bench_alone --request 9 --retain full --version bench/.fixtures/alone9full
    python -m bench.bench_alone --request 9 --start bench/.fixtures/chainT/v9 --more-retain"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from bench.bench_chain import RUN_FILE, run_into
from bench.bench_one_request import changed_answers
from bench.bench_sequential import PAIRS, Measurer, sequential_records, set_secrets
from bench.mini_tofu import fixture, tofu_records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_alone")
    parser.add_argument("--request", type=int, required=True, choices=range(1, len(PAIRS) + 1),
                        help="which of the ten pairs")
    parser.add_argument("--retain", choices=("chain", "full"), default="chain",
                        help="the chain's retain set at that request, or every record but the pair's")
    parser.add_argument("--version", type=Path, default=None, help="keep (and reuse) the version in this folder")
    parser.add_argument("--params", default="{}", help="MASC parameters as JSON (default: none)")
    parser.add_argument("--start", type=Path, default=None,
                        help="the version the run starts from, its own retain reference (default: the root)")
    parser.add_argument("--more-retain", action="store_true",
                        help="the first half of the 57 unprotected world facts joins the retain set; utility is "
                             "read on the other half (with or without it, for a like comparison: --half-utility)")
    parser.add_argument("--half-utility", action="store_true", help="utility on the second half only")
    args = parser.parse_args(argv)
    overrides = json.loads(args.params)
    root = Path(fixture("sequential", log=lambda line: print(line, file=sys.stderr)))
    tofu, kept, utility_set = sequential_records()
    sets = [tofu_records(range(a, b + 1)) for a, b in PAIRS[:args.request]]
    forget = sets[-1]
    leaving = {r["id"] for s in (sets if args.retain == "chain" else sets[-1:]) for r in s}
    retain = [r for r in tofu if r["id"] not in leaving] + kept
    secrets, distinctive = set_secrets(sets, tofu, kept + utility_set)  # on all 57, as the chain reads them
    half = len(utility_set) // 2
    if args.more_retain:
        retain += utility_set[:half]
    if args.more_retain or args.half_utility:
        utility_set = utility_set[half:]
    base = Measurer(root, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as scratch:
        made = args.version or Path(scratch)
        if not (made / RUN_FILE).exists():
            run_into(made, args.start or root, forget, retain, overrides, None, anchor=None)
        result = json.loads((made / RUN_FILE).read_text())
        after = Measurer(made, torch.device("cpu"))
        own = after.erased(forget, secrets[-1], distinctive[-1])
        print(json.dumps({
            "request": args.request, "retain": args.retain, "retain_records": len(retain), "params": result["params"],
            "start": str(args.start or "root"), "utility_records": len(utility_set),
            **({"start_utility": Measurer(args.start, torch.device("cpu")).utility(utility_set)} if args.start else {}),
            "seconds": round(result["seconds"], 1), "stop_reason": result["stop_reason"], "steps": result["steps"],
            "exact_match": own["exact_match"], "leak_greedy": own["leak_greedy"],
            "leak_distinctive": own["leak_distinctive"],
            "utility": after.utility(utility_set), "base_utility": base.utility(utility_set),
            "utility_margins": after.utility_margins(utility_set),
            "base_utility_margins": base.utility_margins(utility_set),
            "utility_answers_changed": changed_answers(base.answers(utility_set), after.answers(utility_set), shown=3),
            "answers": own["answers"]}), flush=True)


if __name__ == "__main__":
    main()
