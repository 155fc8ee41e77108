"""Which content spans the stop rule finds in a version's greedy answers to one request of the chain, judged as a run
of that request from the root judges them (its content, its kept texts, the words said about anyone): the records
held open by a leak, the spans each says, and the most common ones. Prints the spans' text: a diagnostic on the
benchmark's public records, not something the service ever stores.

    python -m bench.rule_leaks --request 10 --version bench/.fixtures/alone10
    python -m bench.rule_leaks --request 10 --version bench/.fixtures/alone10 --every-word   # as judged before"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from bench.bench_sequential import PAIRS, sequential_records
from bench.mini_tofu import fixture, tofu_records
from lethe.engine.data.inputs import RunInputs
from lethe.engine.data.secrets import leaks
from lethe.engine.methods import get_method
from lethe.engine.methods.masc.answers import Answering
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.stop_policy import MascStopPolicy
from lethe.engine.model.loading import load_model
from lethe.engine.training.setup import build_trainable_model, prepare


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rule_leaks")
    parser.add_argument("--request", type=int, required=True, choices=range(1, len(PAIRS) + 1))
    parser.add_argument("--version", type=Path, required=True, help="the version whose answers are judged")
    parser.add_argument("--retain", choices=("chain", "full"), default="chain",
                        help="the chain's retain set at that request, or every record but the pair's")
    parser.add_argument("--every-word", action="store_true",
                        help="hold every content word against the answers, as the rule did before words said about "
                             "anyone were left out (Answering.hold_chance_words)")
    args = parser.parse_args(argv)
    if args.every_word:
        Answering.hold_chance_words = lambda self: 0  # type: ignore[method-assign]
    root = str(fixture("sequential", log=lambda line: print(line, file=sys.stderr)))
    tofu, kept, _ = sequential_records()
    sets = [tofu_records(range(a, b + 1)) for a, b in PAIRS[:args.request]]
    leaving = {r["id"] for s in (sets if args.retain == "chain" else sets[-1:]) for r in s}
    retain = [r for r in tofu if r["id"] not in leaving] + kept
    params = get_method("masc").parse({}).resolved()
    run = prepare(root, RunInputs.of(sets[-1], retain, None, "plain"), params, "cpu", objective=Masc)
    objective = Masc(run.params, build_trainable_model(run.model, run.params, Masc, run.precision),
                     run.tokenizer.pad_token_id)
    policy = MascStopPolicy(run, run.params)
    policy.start(objective)  # theta_0's content, kept texts and words said about anyone, as the run has them
    assert policy.replays is not None
    answering = policy.replays.answering
    model, _ = load_model(args.version, torch.device("cpu"))
    counts: Counter = Counter()
    held = []
    for answer in answering.ask(model, run.forget, ("prompt",)):
        record = answering.by_id[answer.record_id]
        hits = [s for s in answering.spans_for(record, record.source["prompt"]) if leaks(s, answer.text)]
        counts.update(hits)
        if answer.leaked:
            held.append({"id": answer.record_id, "spans": hits, "answer": answer.text[:160]})
    print(json.dumps({"request": args.request, "version": str(args.version), "answers": len(run.forget),
                      "leaking": len(held), "chance_words": policy.replays.chance_words,
                      "spans": sum(len(s) for s in answering.spans_of.values()),
                      "most_common": counts.most_common(15), "held": held}))


if __name__ == "__main__":
    main()
