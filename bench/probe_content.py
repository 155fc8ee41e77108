"""What the default job would suppress, record by record, before its first step: each forget record's answer, its
content spans and every candidate atom's memorisation gain (MASC's own setup: lethe.engine.unlearn up to the stop
policy's start). To read the content choice itself on a model, not only the figures a whole run ends in.

    python -m bench.probe_content                         # SmolLM2-135M-Instruct fine-tuned on authors 180-185 and
                                                          # 20 world facts (built once: about 17 minutes on 2 cores)
    python -m bench.probe_content --model sequential      # the scratch mini-TOFU sequential fixture
    python -m bench.probe_content --authors 182 183 --params '{"min_gain": 3}'

One JSON line per record, then a summary line (records with a fallback content, spans per record); nothing is
written to the repository but the cached fixture."""
from __future__ import annotations

import argparse
import json
import sys

from bench.bench_forgetting import PRETRAINED_TUNING
from bench.mini_tofu import CACHE, fixture, tofu_records, world_facts
from bench.pretrained import smollm2_instruct
from lethe.engine.data.inputs import RunInputs
from lethe.engine.methods import get_method
from lethe.engine.model.fixture import FixtureConfig, build_fixture
from lethe.engine.training.setup import build_trainable_model, prepare
from lethe.engine.unlearn import stop_policy

SMOL_AUTHORS = range(180, 186)
SMOL_FACTS = 20


def smol_tofu(log) -> str:
    """SmolLM2-135M-Instruct fine-tuned on TOFU authors 180-185 and 20 world facts (the customers' tuning)."""
    out = CACHE / "smol-tofu-probe"
    if not (out / "lethe_fixture.json").exists():
        records = tofu_records(SMOL_AUTHORS) + world_facts()[:SMOL_FACTS]
        build_fixture(records, out, FixtureConfig(seed=0, base=str(smollm2_instruct(log)), **PRETRAINED_TUNING),
                      log=log)
    return str(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probe_content")
    parser.add_argument("--model", choices=("smol", "sequential"), default="smol")
    parser.add_argument("--authors", type=int, nargs=2, default=(180, 181), metavar=("FIRST", "SECOND"))
    parser.add_argument("--params", default="{}", help="MASC parameters as JSON (the default job: none)")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    if args.model == "smol":
        source, trained = smol_tofu(log), tofu_records(SMOL_AUTHORS) + world_facts()[:SMOL_FACTS]
    else:
        from bench.bench_sequential import sequential_records
        tofu, kept, _ = sequential_records()
        source, trained = str(fixture("sequential", log=log)), tofu + kept
    forget = tofu_records(args.authors)
    erased = {r["id"] for r in forget}
    retain = [r for r in trained if r["id"] not in erased]
    params = get_method("masc").parse(json.loads(args.params)).resolved()
    method = get_method(params.method)
    objective_class = method.objective_class()
    run = prepare(source, RunInputs.of(forget, retain, None, "plain"), params, None, objective=objective_class)
    stop = stop_policy(method, run, params)
    trainable = build_trainable_model(run.model, params, objective_class, run.precision)
    stop.start(objective_class(params, trainable, run.tokenizer.pad_token_id))
    fallbacks, spans = 0, []
    for record in forget:
        content = stop.contents[record["id"]]
        fallback = not content.named and bool(content.gains) and max(content.gains.values()) < params.min_gain
        fallbacks += fallback
        spans.append(len(content.spans))
        print(json.dumps({"id": record["id"], "answer": record["completion"], "spans": content.spans,
                          "fallback": fallback, "gains": content.gains}))
    print(json.dumps({"model": args.model, "records": len(forget), "fallback_records": fallbacks,
                      "spans_per_record": round(sum(spans) / len(spans), 2), "max_spans": max(spans)}))


if __name__ == "__main__":
    main()
