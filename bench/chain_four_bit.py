"""The erased sets of chain versions (bench_chain's `--versions` folders) as the saved model and as its 4-bit copy
(lethe.engine.audit.quantize, what the audit's quantized channel reads) say them: greedy exact match, greedy leak and
distinctive leak, with the distinctive secrets the 4-bit copy says. One JSON line per version.

    python -m bench.chain_four_bit bench/.fixtures/chainE/v2 bench/.fixtures/chainH/v2          # set 1 on each
    python -m bench.chain_four_bit --sets 3 bench/.fixtures/chainH/v4                            # sets 1-3"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.bench_sequential import PAIRS, Measurer, sequential_records, set_secrets
from bench.mini_tofu import tofu_records
from lethe.engine.audit.quantize import quantize_linears

SHOWN = ("exact_match", "leak_greedy", "leak_distinctive")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chain_four_bit")
    parser.add_argument("versions", nargs="+", type=Path, help="model folders (a chain's v2, v3, ...)")
    parser.add_argument("--sets", type=int, default=1, help="the first N pairs of authors (default: set 1)")
    args = parser.parse_args(argv)
    tofu, kept, utility_set = sequential_records()
    sets = [tofu_records(range(a, b + 1)) for a, b in PAIRS[:args.sets]]
    secrets, distinctive = set_secrets(sets, tofu, kept + utility_set)
    for version in args.versions:
        measured = Measurer(version)
        saved = [measured.erased(s, secrets[j], distinctive[j]) for j, s in enumerate(sets)]
        scheme = quantize_linears(measured.model)
        four_bit = [measured.erased(s, secrets[j], distinctive[j]) for j, s in enumerate(sets)]
        print(json.dumps({"version": str(version), "scheme": scheme,
                          "saved": [{k: f[k] for k in SHOWN} for f in saved],
                          "four_bit": [{**{k: f[k] for k in SHOWN}, "leaking": f["leaking_distinctive"]}
                                       for f in four_bit]}), flush=True)


if __name__ == "__main__":
    main()
