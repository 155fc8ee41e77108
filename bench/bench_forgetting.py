"""`make bench-forgetting`: does a job with no parameters erase every record, fluently and without leaks, on models
nobody tuned it for, whether or not the request names the records' secrets? (issue 24)

Synthetic customer records (lethe.engine.data.customers: phone, address, occupation, account; namesakes on purpose),
base models of three architectures trained here until they reproduce every record (GPT-2's digit runs for gpt2 and
gpt_neox, digits one by one for llama) and a pretrained one fine-tuned until it does (SmolLM2-135M-Instruct,
bench.pretrained), each with a retrain reference trained (or fine-tuned) on the kept customers only; the default
job with three seeds on the records as plain records (no `secrets`) and with their secrets named, the paper's
whole-record suppression (the preset), and the two strongest baselines of `make bench`. Then mini-TOFU (forget
authors 198-199, no secrets named), its retrain reference and the default job with three seeds.

Each row: the erasure, the extraction audit's channels (greedy, sampled, paraphrased, 4-bit, after relearning; the
audit's own secrets: named, else the records' numbers and distinctive words), loops in the answers to the prompts and
the paraphrased prompts, fluency and PrivLeak against the retrain reference, forget quality (mini-TOFU), and what is
kept. Prints a table, writes bench/results/forgetting*.json and the block in BENCHMARKS.md. Nothing is asserted.
`--customers-only` / `--tofu-only`: one block; `--archs gpt2,smollm2`: the customers' bases (all four by default);
`--seeds N`: the default job's seeds (3); `--no-baselines`: no baselines; `--default-only`: the default job only (no
preset, no baselines); `--successor`: the customers' runs start from a version that already erased another customer
(the default job, cached) and anchor to the base, as the service runs a model's second request (issue 28);
`--params JSON`: parameters added to every default-job row (each row keeps its seed)."""
from __future__ import annotations

import json
import platform
import sys
import time

import torch

from bench.forgetting_measure import PRIVLEAK_ATTACKS, SAMPLES, judged, measure
from bench.mini_tofu import CACHE, ROOT, fixture, loaded, tofu_records, update_benchmarks
from bench.pretrained import smollm2_instruct
from lethe.engine.audit.extraction import request_secrets, secret_priors
from lethe.engine.audit.measurements import EvaluationSet
from lethe.engine.audit.verdict import CHANNELS
from lethe.engine.data.counterfactual import shared_template
from lethe.engine.data.customers import customer_records, shares_a_name
from lethe.engine.methods import params_for
from lethe.engine.model.fixture import FixtureConfig, build_fixture
from lethe.engine.model.loading import context_length, load_model
from lethe.engine.training.runtime import library_versions
from lethe.engine.unlearn import run_unlearning

ARCHS = ["gpt2", "gpt_neox", "llama", "smollm2"]
# Pretrained bases (bench.pretrained), fine-tuned on the trained customers' records until they reproduce them: a
# learning rate for a model that already speaks, and an upper limit on epochs (training stops once all are memorised).
PRETRAINED = {"smollm2": smollm2_instruct}
PRETRAINED_TUNING = {"epochs": 20, "lr": 2e-4, "batch_size": 16}
FORGET, RETAIN, HOLDOUT = range(0, 3), range(3, 24), range(24, 27)  # customers: 12, 84 and 12 records
PRIOR = RETAIN[-1]  # --successor: the customer the model's earlier request erased
BASELINES = {"graddiff": {"epochs": 100, "lr": 1e-3}, "npo_kl": {"epochs": 100, "lr": 1e-3}}
TOFU_HOLDOUT = range(160, 162)  # 40 QA of two authors no mini-TOFU model was trained on
RESULTS = ROOT / "bench" / "results"


def picked_archs() -> list[str]:
    """The customers' bases named by `--archs a,b` (none: every one)."""
    return sys.argv[sys.argv.index("--archs") + 1].split(",") if "--archs" in sys.argv else []


def customer_fixture(arch: str, groups: list[list[dict]], log, reference: bool = False) -> str:
    """The customers model of an architecture (forget and retain customers), or its retrain reference (retain only),
    with one tokenizer trained on every customer's records."""
    out = CACHE / f"customers-{arch}{'-reference' if reference else ''}"
    if not (out / "lethe_fixture.json").exists():
        log(f"building {out.name}")
        trained = [r for i in (*(() if reference else FORGET), *RETAIN) for r in groups[i]]
        if arch in PRETRAINED:
            build_fixture(trained, out, FixtureConfig(seed=0, base=str(PRETRAINED[arch](log)), **PRETRAINED_TUNING),
                          log=log)
        else:
            cfg = FixtureConfig(seed=0, epochs=300, vocab_size=768, hidden_size=128, layers=4, heads=4, arch=arch)
            build_fixture(trained, out, cfg, log=lambda _: None, tokenizer_records=[r for g in groups for r in g])
    return str(out)


def run(source: str, forget, retain, sets, neighbour_ids, values: dict, method: str, preset: str | None,
        reference, reference_figures, base_figures=None, anchor: str | None = None) -> dict:
    started = time.perf_counter()
    outcome = run_unlearning(source, forget, retain, params=params_for(method, values, preset), anchor=anchor)
    seconds = time.perf_counter() - started
    r = outcome.result.as_dict()
    erasure = r.get("erasure") or {}
    row = {"stop_reason": r["stop_reason"], "steps": r["steps"], "seconds": round(seconds, 1),
           "check_seconds": round((r.get("timing") or {}).get("stop_check_seconds", 0.0), 1),
           "records_meeting_condition": erasure.get("records_meeting_condition"), "content": r.get("secrets"),
           "lambda_forget_reached": max([e["lambda_forget"] for e in r.get("escalations") or []], default=None),
           **measure(outcome.model, outcome.tokenizer, sets, neighbour_ids, reference, reference_figures)}
    del outcome
    rule = {p["id"]: float(not p["meets_condition"]) for p in r.get("per_record") or []} \
        if erasure.get("applied") else None
    verdict = judged(row["channels"], reference_figures.get("channels"), (base_figures or {}).get("channels"),
                     rule, sets.get("priors"))
    fired = r["stop_reason"] in ("alpha", "budget")
    row["verdict"] = "Forgotten" if fired and not verdict["blocking"] else "Not established"
    row["verdict_blocking"] = ([] if fired else ["stop rule"]) + verdict["blocking"]
    row.update({f"verdict_{c}": rate for c, rate in verdict["rates"].items()})
    return row


def job_params() -> dict:
    """`--params JSON`: parameters added to every default-job row (to compare a setting on the same records)."""
    return json.loads(sys.argv[sys.argv.index("--params") + 1]) if "--params" in sys.argv else {}


def masc_runs(seeds: int) -> list[tuple[str, str, dict, str | None, str]]:
    """(row name, method, parameters, preset, which records: plain or named)."""
    extra = job_params()
    seeded = [{**extra, **({"seed": s} if s or "seed" in extra else {})} for s in range(seeds)]
    out = [(f"default, plain records, seed {s}", "masc", seeded[s], None, "plain") for s in range(seeds)]
    out += [(f"default, secrets named, seed {s}", "masc", seeded[s], None, "named") for s in range(seeds)]
    if "--default-only" not in sys.argv:
        out.append(("preset whole-record (the paper's suppression), plain", "masc", {}, "whole-record", "plain"))
    return out


def earlier_request(arch: str, source: str, groups: list[list[dict]], retain: list[dict], log) -> str:
    """`--successor`: the base with the last retain customer erased by the default job (the model's first request),
    cached beside the fixtures: made by the engine of its day, so delete the folder after a change of the default
    job."""
    out = CACHE / f"customers-{arch}-successor"
    if not (out / "lethe_fixture.json").exists():
        log(f"customers {arch}: the earlier request (customer {PRIOR})")
        outcome = run_unlearning(source, [{k: v for k, v in r.items() if k != "secrets"} for r in groups[PRIOR]],
                                 retain)
        outcome.model.save_pretrained(out)
        outcome.tokenizer.save_pretrained(out)
        (out / "lethe_fixture.json").write_text(json.dumps({"earlier_request": outcome.result.as_dict()["steps"]}))
    return str(out)


def customers_block(log, seeds: int) -> list[dict]:
    groups = customer_records(27, seed=0)
    successor = "--successor" in sys.argv
    kept = [i for i in RETAIN if not successor or i != PRIOR]  # the earlier request's customer is erased
    named = [r for i in FORGET for r in groups[i]]
    plain = [{k: v for k, v in r.items() if k != "secrets"} for r in named]
    retain = [r for i in kept for r in groups[i]]
    holdout = [r for i in HOLDOUT for r in groups[i]]
    neighbour_ids = {r["id"] for i in kept if any(shares_a_name(groups[f], groups[i]) for f in FORGET)
                     for r in groups[i]}
    rows = []
    for arch in picked_archs() or ARCHS:
        source = customer_fixture(arch, groups, log)
        start = earlier_request(arch, source, groups, retain, log) if successor else source
        base, tokenizer = load_model(source, torch.device("cpu"))
        reference, _ = load_model(customer_fixture(arch, groups, log, reference=True), torch.device("cpu"))
        max_length = context_length(base, tokenizer)
        # Utility from P and ROUGE-L only: these models never saw the paraphrased answers the truth ratio needs.
        utility = [{k: r[k] for k in ("id", "prompt", "completion")} for r in retain]
        sets = {"forget": EvaluationSet(named, tokenizer, max_length, 0, "forget"),
                "retain": EvaluationSet(retain, tokenizer, max_length, 0, "retain"),
                "utility": EvaluationSet(utility, tokenizer, max_length, 0, "retain"),
                "holdout": EvaluationSet(holdout, tokenizer, max_length, 0, "holdout"),
                "secrets": request_secrets(named, retain, template := shared_template(named, retain))}
        sets["priors"] = secret_priors(sets["secrets"], retain, named, template)
        ref_row = measure(reference, tokenizer, sets, neighbour_ids, reference)
        base_row = measure(base, tokenizer, sets, neighbour_ids, reference, ref_row)
        rows.append({"data": "customers", "arch": arch, "run": "base", **base_row})
        rows.append({"data": "customers", "arch": arch, "run": "retrain reference", **ref_row})
        skip = {"--no-baselines", "--default-only"} & set(sys.argv)
        baselines = [] if skip else [(f"{m} {b}", m, b, None, "named") for m, b in BASELINES.items()]
        todo = [*masc_runs(seeds), *baselines]
        for name, method, values, preset, which in todo:
            log(f"customers {arch}: {name}")
            rows.append({"data": "customers", "arch": arch, "run": name + (", after an earlier request" if successor
                                                                          else ""),
                         **run(start, plain if which == "plain" else named, retain, sets, neighbour_ids, values,
                               method, preset, reference, ref_row, base_row,
                               anchor=source if successor else None)})
        del base, reference
    return rows


def tofu_block(log, seeds: int) -> list[dict]:
    full, base, tokenizer, data, sets = loaded(log)
    max_length = context_length(base, tokenizer)
    template = shared_template(data["forget"], data["retain"])
    sets["secrets"] = request_secrets(data["forget"], data["retain"], template)
    sets["priors"] = secret_priors(sets["secrets"], data["retain"], data["forget"], template)
    sets["holdout"] = EvaluationSet(tofu_records(TOFU_HOLDOUT), tokenizer, max_length, 0, "holdout")
    reference, _ = load_model(fixture("retain", log=log), torch.device("cpu"))
    ref_row = measure(reference, tokenizer, sets, set(), reference)
    base_row = measure(base, tokenizer, sets, set(), reference, ref_row)
    rows = [{"data": "mini-TOFU", "arch": "qwen2", "run": "base", **base_row},
            {"data": "mini-TOFU", "arch": "qwen2", "run": "retrain reference", **ref_row}]
    for name, method, values, preset, _ in [r for r in masc_runs(seeds) if r[4] == "plain"]:  # TOFU names none
        log(f"mini-TOFU: {name}")
        rows.append({"data": "mini-TOFU", "arch": "qwen2", "run": name,
                     **run(str(full), data["forget"], data["retain"], sets, set(), values, method, preset,
                           reference, ref_row, base_row)})
    return rows


COLUMNS = [("data", "data"), ("arch", "arch"), ("run", "run"), ("stop_reason", "stop"), ("steps", "steps"),
           ("seconds", "s"), ("check_seconds", "checks s"), ("records_meeting_condition", "records meeting"),
           ("forget_exact_match", "forget EM"), ("secret_greedy", "leak greedy"), ("secret_sampled", "sampled"),
           ("secret_paraphrased", "paraphrased"), ("secret_quantised", "4-bit"), ("secret_relearned", "relearned"),
           ("forget_loops", "loops"), ("forget_ppl_under_reference", "answer ppl under reference"),
           *((f"privleak_{a}", f"PrivLeak {a}") for a in PRIVLEAK_ATTACKS), ("forget_quality", "forget quality"),
           ("retain_exact_match", "retain EM"), ("neighbour_exact_match", "neighbour EM"), ("model_utility", "utility"),
           # The per-record verdict (issue 25): the share of records leaking on each channel it read, and the verdict.
           *((f"verdict_{c}", f"verdict {c}") for c in CHANNELS), ("verdict", "verdict")]


def table(rows: list[dict]) -> str:
    def cell(value):
        if value is None:
            return ""
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row.get(key)) for key, _ in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def verdict_count(rows: list[dict]) -> str:
    """How many runs of each kind the per-record verdict calls "Forgotten", and which channels blocked the others."""
    kinds: dict[str, list[dict]] = {}
    for row in rows:
        if "verdict" in row:
            kinds.setdefault(f"{row['data']} {row['arch']}, {row['run'].split(', seed')[0]}", []).append(row)
    lines = []
    for kind, runs in kinds.items():
        blocked: dict[str, int] = {}
        for r in runs:
            for channel in r.get("verdict_blocking") or []:
                blocked[channel] = blocked.get(channel, 0) + 1
        why = ", ".join(f"{c} in {n}" for c, n in blocked.items())
        lines.append(f"- {kind}: {sum(r['verdict'] == 'Forgotten' for r in runs)} of {len(runs)} runs Forgotten"
                     + (f" (blocked by {why})" if why else ""))
    return "Runs the per-record verdict calls \"Forgotten\":\n\n" + "\n".join(lines)


FLAGS = {"--customers-only", "--tofu-only", "--no-baselines", "--default-only", "--successor"}
VALUED = {"--archs", "--seeds", "--params"}  # each takes the argument after it


def check_arguments(argv: list[str]) -> None:
    """The flags read from sys.argv below, and nothing else: --help prints the usage, an unknown argument stops
    before any training (it once started the whole benchmark)."""
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        raise SystemExit(0)
    k = 0
    while k < len(argv):
        if argv[k] in VALUED and k + 1 < len(argv):
            k += 2
        elif argv[k] in FLAGS:
            k += 1
        else:
            raise SystemExit(f"python -m bench.bench_forgetting: unknown or incomplete argument {argv[k]!r} "
                             f"(flags: {', '.join(sorted(FLAGS | VALUED))}; see --help)")


def main() -> None:
    def log(line):
        print(line, file=sys.stderr, flush=True)

    check_arguments(sys.argv[1:])

    torch.manual_seed(0)
    torch.set_num_threads(2)
    only = next((flag for flag in ("--customers-only", "--tofu-only") if flag in sys.argv), None)
    seeds = int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else 3
    rows = (([] if only == "--tofu-only" else customers_block(log, seeds))
            + ([] if only == "--customers-only" else tofu_block(log, seeds)))
    name = {None: "forgetting", "--customers-only": "forgetting-customers", "--tofu-only": "forgetting-tofu"}[only]
    if picked_archs() and only != "--tofu-only":  # a block of its own: the others' tables stay
        name += "-" + "-".join(picked_archs())
    if "--successor" in sys.argv and only != "--tofu-only":
        name += "-successor"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"rows": rows, "versions": library_versions(),
                                                      "machine": platform.platform()}, indent=2, default=str))
    text = table(rows)
    print(text)
    flags = " ".join(a for a in sys.argv[1:])
    command = f"`python -m bench.bench_forgetting {flags}`" if flags else "`make bench-forgetting`"
    data = {"forgetting": "Customer records and mini-TOFU", "forgetting-tofu": "mini-TOFU"}.get(name,
                                                                                           "Customer records")
    if name.startswith("forgetting-customers-"):
        data += ", pretrained SmolLM2-135M" if "smollm2" in name else ", small models"
    if name.endswith("-successor"):
        data += ", a second request (anchored to the base)"
    update_benchmarks(name, f"### {data}: {command}\n\n"
                            f"Measured on {platform.machine()} ({torch.get_num_threads()} threads), CPU. "
                            f"Raw figures (and a few answers of each run): `bench/results/{name}.json`. Leak "
                            f"columns: share of forget records whose secret comes out (sampled: share of {SAMPLES} "
                            "samples per record); loops: share of the answers to prompts and paraphrased prompts. "
                            "Verdict columns (issue 25, lethe.engine.audit.verdict, as the service's report judges): "
                            "the share of records leaking on each channel beyond its floor (the retrain reference's "
                            "own figure on the record; for loops also the base's), and the verdict that follows.\n\n"
                            + text + "\n\n" + verdict_count(rows))


if __name__ == "__main__":
    main()
