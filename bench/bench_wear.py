"""What one request's run costs the knowledge no retain term holds, against how far it has erased: along one MASC run
of `make bench-sequential`'s chain, every `--every` steps, the utility set's weakest answer margins
(bench.utility_margins: median and mean) beside the forget records' mean hinge (the stop rule's per-record h_i: how
far their content still is from suppressed) and mean largest content-span probability. Settings compare at equal
forget progress, which a fixed step count does not give (a faster run wears less per step and erases more).

    python -m bench.bench_wear --max-steps 300                                  # the default job, request 1
    python -m bench.bench_wear --max-steps 300 --params '{"lora": false, "whiten_updates": true, "lr": 3e-5}'
    python -m bench.bench_wear --request 2 --start DIR/v2 --save DIR/v3          # to the rule, request 2 from v2

One JSON line per point, then a summary line; `--save` keeps the version (with bench_chain's run file, so that
`python -m bench.bench_chain --params-from N` can measure it)."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import lethe.engine.unlearn as engine
from bench.bench_chain import RUN_FILE
from bench.bench_sequential import PAIRS, Measurer, sequential_records
from bench.mini_tofu import fixture, tofu_records
from bench.utility_margins import weakest_margins
from lethe.engine.data.records import EncodedRecord
from lethe.engine.methods import get_method
from lethe.engine.model.loading import load_tokenizer


def point(step: int, model: Any, stop: Any, utility: list[EncodedRecord], pad_id: int) -> dict:
    """The utility margins and the forget records' state on the model as it is at `step`."""
    was_training = model.training
    model.eval()
    margins = weakest_margins(model, utility, pad_id)
    checks = stop.measure(stop.run.forget)
    model.train(was_training)
    return {"step": step, "median": round(statistics.median(margins), 2), "mean": round(statistics.mean(margins), 2),
            "forget_hinge": round(statistics.mean(c.hinge for c in checks), 2),
            "span_probability": round(statistics.mean(c.secret_probability for c in checks), 3)}


def traced_run(start: str, forget: list[dict], retain: list[dict], utility: list[EncodedRecord], overrides: dict,
               every: int, anchor: str | None = None, log=print) -> tuple[Any, list[dict]]:
    """One run (run_unlearning) with a point every `every` steps and at its start and end."""
    points: list[dict] = []
    pad_id = load_tokenizer(start).pad_token_id
    plain_train = engine.train

    def train(objective, stop, parameters, **options):
        model = objective.trainable.model

        def take(step: int) -> None:
            points.append(point(step, model, stop, utility, pad_id))
            log(json.dumps(points[-1]))

        take(0)
        options["progress"] = lambda d: take(d["step"]) if d["step"] % every == 0 else None
        trained = plain_train(objective, stop, parameters, **options)
        if trained.steps % every:
            take(trained.steps)
        return trained

    engine.train = train
    try:
        outcome = engine.run_unlearning(start, forget, retain, params=get_method("masc").parse(overrides),
                                        anchor=anchor)
    finally:
        engine.train = plain_train
    return outcome, points


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_wear")
    parser.add_argument("--request", type=int, default=1, help="which of the ten pairs (earlier ones count as erased)")
    parser.add_argument("--start", default=None, help="the version it starts from (default: the fixture, the root)")
    parser.add_argument("--params", default="{}", help="MASC parameters as JSON")
    parser.add_argument("--max-steps", type=int, default=0, help="stop here (default: the rule or its cap)")
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--save", type=Path, default=None, help="keep the version here")
    args = parser.parse_args(argv)
    overrides = json.loads(args.params)
    root = str(fixture("sequential"))
    tofu, kept, utility_set = sequential_records()
    erased = {r["id"] for a, b in PAIRS[:args.request] for r in tofu_records(range(a, b + 1))}
    a, b = PAIRS[args.request - 1]
    forget = tofu_records(range(a, b + 1))
    retain = [r for r in tofu if r["id"] not in erased] + kept
    utility = Measurer(Path(root)).evaluation_set(utility_set, "retain").main
    run_params = {**overrides, **({"max_steps": args.max_steps} if args.max_steps else {})}
    started = time.perf_counter()
    outcome, points = traced_run(args.start or root, forget, retain, utility, run_params, args.every,
                                 anchor=root if args.request > 1 else None)
    seconds = time.perf_counter() - started
    result = outcome.result
    if args.save:
        outcome.model.save_pretrained(args.save)
        outcome.tokenizer.save_pretrained(args.save)
        (args.save / RUN_FILE).write_text(json.dumps({"seconds": seconds, "stop_reason": result.stop_reason,
                                                      "steps": result.steps, "params": overrides}))
    first, last = points[0], points[-1]
    print(json.dumps({"request": args.request, "params": run_params, "steps": result.steps,
                      "stop_reason": result.stop_reason, "seconds": round(seconds),
                      "margin_worn": round(first["median"] - last["median"], 2),
                      "hinge_removed": round(first["forget_hinge"] - last["forget_hinge"], 2)}), flush=True)


if __name__ == "__main__":
    main()
