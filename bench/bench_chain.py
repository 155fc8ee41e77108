"""The first requests of `make bench-sequential` on the engine alone (no service, no audit): request n erases its pair
of authors from version n-1, the retain term anchored to the root (the fixture) as the service anchors it, the retain
set the model's at that point (the QA not erased so far and the 60 world facts). After every request: each erased
set so far (greedy exact match and secret leakage, beside its figures right after its own erasure), retain exact match
on a seeded 100, model utility on the 57 world facts no retain term holds, how close their answers are to flipping
(bench.utility_margins), and how many of them the requests so far answer differently from the base. A cheaper way
(about half the service's time per request) to compare settings on drift; one JSON line per request, nothing written
but the versions where `--versions` names a folder.

    python -m bench.bench_chain --requests 3                                 # the default job
    python -m bench.bench_chain --requests 3 --params '{"number_tokens": "all"}'
    python -m bench.bench_chain --requests 3 --anchor start                  # each run anchored to its start
    python -m bench.bench_chain --requests 3 --anchor turns                  # root for requests 2, 4, ...
    python -m bench.bench_chain --requests 10 --versions bench/.fixtures/chain  # resumable: versions kept
    python -m bench.bench_chain --requests 3 --relearn                       # and each own set after relearning
    python -m bench.bench_chain --requests 2 --params-from 2 --params '{"lora_r": 4}' --versions DIR
                                                                             # request 2 only, from DIR's v2
    python -m bench.bench_chain --requests 2 --from-root --versions DIR      # each run from the root; measured:
                                                                             # the root plus every run's change
    python -m bench.bench_chain --requests 10 --together --device cuda       # on a GPU: the whole stream, then
                                                                             # the ten coalesced into one run
    python -m bench.bench_chain --requests 10 --together-only --versions DIR # request 1, then the ten in one run"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.bench_one_request import changed_answers
from bench.bench_sequential import PAIRS, Measurer, regressed, sequential_records, set_secrets
from bench.mini_tofu import fixture, tofu_records
from lethe.engine.contract.record_checks import REQUEST
from lethe.engine.methods import get_method
from lethe.engine.unlearn import run_unlearning

RETAIN_SAMPLE = 100
RUN_FILE = "bench_chain_run.json"  # the run's seconds, stop and steps, beside its version
EVIDENCE_FILE = "bench_chain_evidence.json"  # why it stopped where it did: served checks, failing records, the guard


def run_into(made: Path, start: Path, forget: list[dict], retain: list[dict], overrides: dict, device: str | None,
             anchor: str | None) -> dict:
    """One MASC run from `start`, its version saved in `made` with RUN_FILE (seconds, stop, steps) written last."""
    started = time.perf_counter()
    outcome = run_unlearning(str(start), forget, retain, params=get_method("masc").parse(overrides), anchor=anchor,
                             device=device)
    seconds = time.perf_counter() - started
    outcome.model.save_pretrained(made)
    outcome.tokenizer.save_pretrained(made)
    ran = outcome.result.as_dict()
    result = {"seconds": seconds, "stop_reason": ran["stop_reason"], "steps": ran["steps"], "params": overrides}
    (made / EVIDENCE_FILE).write_text(json.dumps(ran, default=str))
    (made / RUN_FILE).write_text(json.dumps(result))
    return result


def coalesced(sets: list[list[dict]]) -> list[dict]:
    """The sets' records in one run, each naming its set as its request, as the service's coalesced run names each
    member's job (lethe.service.domain.runs.union_records)."""
    return [{**r, REQUEST: f"request-{j + 1}"} for j, s in enumerate(sets) for r in s]


def composed(root: Path, own: list[Path], out: Path) -> None:
    """`--from-root`: the root's weights plus every run's change (own_i - root), saved in `out` with the root's
    tokenizer: what a lineage would publish if each request were erased from the root on its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(root)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    total = {k: v.clone() for k, v in base.items()}
    for version in own:
        theirs = AutoModelForCausalLM.from_pretrained(version).state_dict()
        for k, v in total.items():
            if v.is_floating_point():
                v += theirs[k] - base[k]
    model.load_state_dict(total)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(root).save_pretrained(out)


def anchored_to_root(request: int, anchor: str) -> bool:
    """Whether request `request` (1-based) anchors its retain term to the root; request 1 starts from the root."""
    return request > 1 and (anchor == "root" or (anchor == "turns" and request % 2 == 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_chain")
    parser.add_argument("--requests", type=int, default=3, help="how many of the ten pairs, in order")
    parser.add_argument("--params", default="{}", help="MASC parameters as JSON for every request (default: none)")
    parser.add_argument("--anchor", choices=("root", "start", "turns"), default="root",
                        help="the retain term's reference: the root, as the service anchors it, each run's start "
                             "version (as before issue 28), or by turns: the root for even-numbered requests, the "
                             "start for odd ones, to compare")
    parser.add_argument("--versions", type=Path, default=None,
                        help="keep each version in this folder (v2, v3, ...) and reuse those it holds, so that a "
                             "stopped chain goes on where it stopped (default: a temporary folder)")
    parser.add_argument("--together", action="store_true",
                        help="then one run from the root erasing every request's authors at once (what coalescing "
                             "makes of a queue), timed against the first request")
    parser.add_argument("--together-only", action="store_true",
                        help="--together after request 1 alone (run or taken from --versions, to time it): the "
                             "other requests of the chain are neither run nor measured")
    parser.add_argument("--params-from", type=int, default=1, metavar="N",
                        help="--params apply from request N on; the versions of earlier requests are taken from "
                             "--versions as they are, whatever made them (to compare settings on request N from the "
                             "same start: copy v2..vN into a new folder)")
    parser.add_argument("--from-root", action="store_true",
                        help="each request's run from the root (its own version r<n>), not from version n-1; the "
                             "version measured after request n is the root plus the sum of runs 1..n's changes")
    parser.add_argument("--relearn", action="store_true",
                        help="also run the audit's relearning probe on each request's own set, right after its "
                             "erasure: the share of its records whose distinctive secrets come back")
    parser.add_argument("--device", default=None, help="the runs' and the measurements' device (default: the "
                                                       "engine's choice for the runs, the CPU for the measurements)")
    args = parser.parse_args(argv)
    overrides = json.loads(args.params)
    root = fixture("sequential", log=lambda line: print(line, file=sys.stderr))
    tofu, kept, utility_set = sequential_records()
    sets = [tofu_records(range(a, b + 1)) for a, b in PAIRS[:args.requests]]
    secrets, distinctive = set_secrets(sets, tofu, kept + utility_set)
    measure_on = torch.device(args.device or "cpu")
    base = Measurer(root, measure_on)
    base_utility, base_answers = base.utility(utility_set), base.answers(utility_set)
    base_margins = base.utility_margins(utility_set)
    own: list[dict] = []
    first_seconds = 0.0
    erased: set[str] = set()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.versions or Path(scratch)
        start = Path(root)
        for i, forget in enumerate(sets):
            if args.together_only and i:
                erased |= {r["id"] for r in forget}
                continue
            leaving = erased | {r["id"] for r in forget}
            retain = [r for r in tofu if r["id"] not in leaving] + kept
            made = work / (f"r{i + 1}" if args.from_root and i else f"v{i + 2}")
            reused = i + 1 < args.params_from  # an earlier request's version, taken as it is
            if not (made / RUN_FILE).exists():  # written last: a version without it was cut off
                if reused:
                    raise SystemExit(f"--params-from {args.params_from}: {made} must already hold request {i + 1}")
                run_into(made, Path(root) if args.from_root else start, forget, retain, overrides, args.device,
                         anchor=str(root) if anchored_to_root(i + 1, args.anchor) and not args.from_root else None)
            result = json.loads((made / RUN_FILE).read_text())
            if result["params"] != overrides and not reused:
                raise SystemExit(f"{made} was made with {result['params']}, not {overrides}: use another --versions")
            seconds, start = result["seconds"], made
            if args.from_root and i:  # request 1's run is its own version v2 either way
                start = work / f"v{i + 2}"
                if (start / RUN_FILE).exists():
                    raise SystemExit(f"{start} is a chained run's version, not a sum: use another --versions")
                composed(Path(root), [work / f"v{i + 1}", made], start)  # the last sum plus this run's change
            erased |= {r["id"] for r in forget}
            after = Measurer(start, measure_on)
            figures = [after.erased(s, secrets[j], distinctive[j]) for j, s in enumerate(sets[:i + 1])]
            own.append(figures[i])
            retain_now = [r for r in tofu if r["id"] not in erased] + kept
            sample = random.Random(i).sample(retain_now, min(RETAIN_SAMPLE, len(retain_now)))
            print(json.dumps({
                "request": i + 1, "authors": list(PAIRS[i]), "params": result["params"], "seconds": round(seconds, 1),
                "stop_reason": result["stop_reason"], "steps": result["steps"],
                "exact_match": figures[i]["exact_match"], "leak_greedy": figures[i]["leak_greedy"],
                "leak_distinctive": figures[i]["leak_distinctive"],
                "earlier_exact_match": [f["exact_match"] for f in figures[:i]],
                "earlier_leak_greedy": [f["leak_greedy"] for f in figures[:i]],
                "earlier_leak_distinctive": [f["leak_distinctive"] for f in figures[:i]],
                "earlier_regressed": regressed(figures[:i], own, "leak_distinctive"),
                "earlier_regressed_raw": regressed(figures[:i], own, "leak_greedy"),
                "earlier_leaking_distinctive": [f["leaking_distinctive"] for f in figures[:i]],
                "retain_exact_match": after.retain_exact_match(sample),
                "base_retain_exact_match": base.retain_exact_match(sample),
                "utility": after.utility(utility_set), "base_utility": base_utility,
                "utility_margins": after.utility_margins(utility_set), "base_utility_margins": base_margins,
                "utility_answers_changed": changed_answers(base_answers, after.answers(utility_set), shown=3),
                "answers": figures[i]["answers"],
                **({"relearned_distinctive": after.relearned(forget, distinctive[i])} if args.relearn else {})}),
                flush=True)
            first_seconds = first_seconds or seconds  # request 1's, whether run now or earlier
    if args.together or args.together_only:
        union = coalesced(sets)
        retain = [r for r in tofu if r["id"] not in erased] + kept
        sample = random.Random(len(sets) - 1).sample(retain, min(RETAIN_SAMPLE, len(retain)))  # the last request's
        with tempfile.TemporaryDirectory() as scratch:
            together_dir = args.versions / "together" if args.versions else Path(scratch)  # kept with its evidence
            if not (together_dir / RUN_FILE).exists():
                run_into(together_dir, Path(root), union, retain, overrides, args.device, anchor=None)
            result = json.loads((together_dir / RUN_FILE).read_text())
            if result["params"] != overrides:
                raise SystemExit(f"{together_dir} was made with {result['params']}, not {overrides}")
            seconds = result["seconds"]
            after = Measurer(together_dir, measure_on)
            figures = [after.erased(s, secrets[j], distinctive[j]) for j, s in enumerate(sets)]
            print(json.dumps({
                "together": len(sets), "params": overrides, "seconds": round(seconds, 1),
                "ratio_to_first_request": round(seconds / first_seconds, 2), "stop_reason": result["stop_reason"],
                "steps": result["steps"], "exact_match": [f["exact_match"] for f in figures],
                "leak_greedy": [f["leak_greedy"] for f in figures],
                "leak_distinctive": [f["leak_distinctive"] for f in figures],
                "above_own": [j + 1 for j, f in enumerate(figures[:len(own)])
                              if f["leak_distinctive"] > own[j]["leak_distinctive"]],
                "retain_exact_match": after.retain_exact_match(sample),
                "utility": after.utility(utility_set), "base_utility": base_utility,
                "utility_margins": after.utility_margins(utility_set), "base_utility_margins": base_margins,
                "utility_answers_changed": changed_answers(base_answers, after.answers(utility_set), shown=3),
                "answers": figures[0]["answers"]}), flush=True)


if __name__ == "__main__":
    main()
