"""The retrain reference of the chain (issue 28): the sequential fixture trained again without the first n requests'
sets, as a model that never saw them, and what it says on each of them, measured as bench.bench_chain measures an
erased set. An earlier set that comes back after later requests is the erased set returning where this reference
does not say it, and what the kept records teach about the slot where it does (measured: it gives set 1's
"civil engineer" P 7e-6; BENCHMARKS.md, "The 4-bit answers held to their own record"). The reference is cached
beside the fixture (minutes to build).

    python -m bench.chain_reference --requests 4
    python -m bench.record_probability tofu-3602 civil bench/.fixtures/mini-tofu-sequential-without-4"""
from __future__ import annotations

import argparse
import json
import sys

from bench.bench_sequential import PAIRS, Measurer, sequential_records, set_secrets
from bench.mini_tofu import CACHE, MINI_TOFU, tofu_records
from lethe.engine.model.fixture import build_fixture


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chain_reference")
    parser.add_argument("--requests", type=int, default=4, help="the first n pairs left out of the training data")
    args = parser.parse_args(argv)
    tofu, kept, utility_set = sequential_records()
    sets = [tofu_records(range(a, b + 1)) for a, b in PAIRS[:args.requests]]
    left_out = {r["id"] for s in sets for r in s}
    out = CACHE / f"mini-tofu-sequential-without-{args.requests}"
    if not (out / "lethe_fixture.json").exists():
        print(f"building the retrain reference in {out} (minutes; cached afterwards)", file=sys.stderr)
        everything = tofu + kept + utility_set  # as the sequential fixture: its tokenizer, so token ids agree
        build_fixture([r for r in everything if r["id"] not in left_out], out, MINI_TOFU,
                      log=lambda line: print(line, file=sys.stderr), tokenizer_records=everything)
    secrets, distinctive = set_secrets(sets, tofu, kept + utility_set)
    reference = Measurer(out)
    for j, records in enumerate(sets):
        figures = reference.erased(records, secrets[j], distinctive[j])
        print(json.dumps({"set": j + 1, "authors": list(PAIRS[j]), **figures}), flush=True)


if __name__ == "__main__":
    main()
