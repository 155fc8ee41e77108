"""Where a MASC run's time before and during its first steps goes, as the forget set grows (issue 28: a coalesced run
of ten requests spent 1.2 times a whole request before its first step). The first N pairs of the sequential chain's
authors in one run from the sequential fixture, each pair naming its request as a coalesced run does, for a few
steps; prints the seconds spent in each piece of the stop policy's start and in the run's loop.

    python -m bench.start_cost --requests 10 --steps 1                    # 400 records: the calibration's parts
    python -m bench.start_cost --requests 1 --steps 60 --params '{"batch_size": 40}'   # a step's cost by batch"""
from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from typing import Any

from bench.bench_chain import coalesced
from bench.bench_sequential import PAIRS, sequential_records
from bench.mini_tofu import fixture, tofu_records
from lethe.engine.methods import get_method
from lethe.engine.methods.masc import answers, replay
from lethe.engine.methods.masc import stop_policy as policy
from lethe.engine.unlearn import run_unlearning

STARTING = ("plan_contents", "record_targets", "calibrate", "said_template", "secret_priors", "neighbour_scores")
PIECES: list[tuple[Any, str]] = [(policy, name) for name in STARTING]
PIECES += [(replay.Replays, "start"), (answers.Answering, "__init__"), (answers.Answering, "natural_loops"),
           (answers.Answering, "ask"), (answers.Answering, "set_targets"), (policy.MascStopPolicy, "measure")]


def timed(owner: Any, name: str, seconds: dict[str, float]) -> None:
    """Wrap owner.name so that its calls add their seconds to seconds[label] (nested calls count in both)."""
    inner = getattr(owner, name)
    label = name if owner is policy else f"{owner.__name__}.{name}"

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - started
    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.start_cost")
    parser.add_argument("--requests", type=int, default=10, help="how many of the ten pairs, in one run")
    parser.add_argument("--steps", type=int, default=1, help="max_steps of the run")
    parser.add_argument("--params", default="{}", help="more MASC parameters as JSON")
    args = parser.parse_args(argv)
    seconds: dict[str, float] = defaultdict(float)
    for owner, name in PIECES:
        timed(owner, name, seconds)
    root = fixture("sequential")
    tofu, kept, _ = sequential_records()
    sets = [tofu_records(range(a, b + 1)) for a, b in PAIRS[:args.requests]]
    forget = coalesced(sets)
    erased = {r["id"] for r in forget}
    retain = [r for r in tofu if r["id"] not in erased] + kept
    params = get_method("masc").parse({**json.loads(args.params), "max_steps": args.steps})
    ran = run_unlearning(str(root), forget, retain, params=params).result.as_dict()
    print(json.dumps({"records": len(forget), "retain": len(retain), "steps": ran["steps"], "timing": ran["timing"],
                      "pieces": {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}}))


if __name__ == "__main__":
    main()
