"""`make bench-forgetting`: does a job with no parameters erase every record, on models nobody tuned it for?

Synthetic customer records (worker.engine.customers: phone, address, occupation, account; namesakes on
purpose), base models of several architectures trained here until they reproduce every record, and
the default job through the engine (three seeds; the records name their secrets, so it focuses on them), the
same job on the records without named secrets (whole records), and the two strongest baselines of `make bench`.
Each row: the erasure, the extraction audit (greedy, sampled, paraphrased,
4-bit, after relearning), the degeneration of answers, and retain. Then the default job on mini-TOFU
(forget authors 198-199), next to "secret-focus" and the defaults of issue 10's time (holdout D_val, alpha 0.2,
lambda_forget 0.1, uniform retain sampling), where a retrain reference exists to check the calibrated alpha against.
Prints a table, writes bench/results/forgetting.json and the block in BENCHMARKS.md. Nothing is asserted."""
from __future__ import annotations

import json
import platform
import sys
import time

import torch

from bench.mini_tofu import CACHE, ROOT, fixture, loaded, update_benchmarks
from worker.engine.audit import EvaluationSet, retain_utility
from worker.engine.calibration import calibrate
from worker.engine.customers import customer_records, shares_a_name
from worker.engine.evaluate import exact_match, greedy_continuations
from worker.engine.extraction import greedy_leaks, request_secrets, sampled_leaks
from worker.engine.fixture import FixtureConfig, build_fixture
from worker.engine.loading import Policy, context_length, load_model
from worker.engine.methods import params_for
from worker.engine.methods.masc import Masc
from worker.engine.metrics.degeneration import answer_perplexity, degeneration
from worker.engine.metrics.text import generation_metrics
from worker.engine.params import AS_PUBLISHED, MascParams
from worker.engine.quantize import quantized_copy
from worker.engine.records import encode_record
from worker.engine.relearn import relearning_probe
from worker.engine.runtime import library_versions
from worker.engine.unlearn import run_unlearning

ARCHS = ["gpt2", "gpt_neox", "llama"]
FORGET, RETAIN, HOLDOUT = range(0, 3), range(3, 24), range(24, 27)  # customers: 12, 84 and 12 records
OLD_DEFAULTS = {"val_mode": "holdout", "alpha": 0.2, "lambda_forget": 0.1, "max_steps": 500, "neighbour_share": 0.0,
                "lambda_retain": 1.0, **AS_PUBLISHED}
# The default job with three seeds (one run's figures are not the method's): the customer records name their
# secrets, so it focuses on them (issue 11: only the secret's tokens suppressed, the rest held at theta_0, the
# secret's mass moved where theta_0 would put it, the model's own answers replayed with their loops suppressed,
# retain argmax gaps kept). Then the same job on the records with their `secrets` left out: whole records,
# as the preset "whole-record" (the audit still checks the secrets the records had).
MASC_RUNS = [(f"default (no parameters), seed {seed}", {"seed": seed} if seed else {}, None) for seed in (0, 1, 2)]
MASC_RUNS += [("default, secrets not named (= preset whole-record)", {}, None)]
# The two strongest baselines of `make bench` on mini-TOFU, with the budget that served them best there.
BASELINES = {"graddiff": {"epochs": 100, "lr": 1e-3}, "npo_kl": {"epochs": 100, "lr": 1e-3}}
SAMPLES = 10  # seeded samples per forget prompt
RESULTS = ROOT / "bench" / "results"


def customer_fixture(arch: str, groups: list[list[dict]], log) -> str:
    out = CACHE / f"customers-{arch}"
    if not (out / "lethe_fixture.json").exists():
        log(f"building the {arch} customer-records model in {out}")
        trained = [r for i in (*FORGET, *RETAIN) for r in groups[i]]
        cfg = FixtureConfig(seed=0, epochs=300, vocab_size=768, hidden_size=128, layers=4, heads=4, arch=arch)
        build_fixture(trained, out, cfg, log=lambda _: None, tokenizer_records=[r for g in groups for r in g])
    return str(out)


def text_of(tokenizer, encoded, model) -> dict[str, str]:
    return {r.id: tokenizer.decode(t, skip_special_tokens=True)
            for r, t in zip(encoded, greedy_continuations(model, tokenizer, encoded))}


def measure(model, tokenizer, sets: dict, neighbour_ids: set[str], base=None) -> dict:
    retain_em = exact_match(model, tokenizer, sets["retain"].main)["per_record"]
    near = [v for k, v in retain_em.items() if k in neighbour_ids]
    far = [v for k, v in retain_em.items() if k not in neighbour_ids]
    forget, secrets = sets["forget"], sets["secrets"]
    answered = generation_metrics(model, tokenizer, forget.main, forget.references)  # one greedy pass serves all
    forget_texts, forget_degeneration = answered["generated"], degeneration(answered["generated"])
    out = {"forget_exact_match": answered["exact_match"]["value"],
           "retain_exact_match": sum(retain_em.values()) / len(retain_em),
           "neighbour_exact_match": sum(near) / len(near) if near else None,
           "other_exact_match": sum(far) / len(far) if far else None,
           "model_utility": retain_utility(model, tokenizer,
                                           sets.get("utility", sets["retain"]))["model_utility"]["value"],
           # The extraction audit (worker.engine.extraction): share of records whose secret comes out.
           "secret_greedy": greedy_leaks(forget_texts, secrets)["value"],
           "secret_sampled": sampled_leaks(model, tokenizer, forget.main, secrets, samples=SAMPLES, seed=0)["value"],
           "secret_paraphrased": greedy_leaks(text_of(tokenizer, forget.paraphrased, model), secrets)["value"]
           if forget.paraphrased else None,
           "forget_loops": forget_degeneration["loop_share"]["value"],
           "forget_distinct_2": forget_degeneration["distinct_2"]["value"],
           "retain_loops": degeneration(text_of(tokenizer, sets["retain"].main, model))["loop_share"]["value"]}
    if base is not None:  # fluency: the answers to erased prompts scored by the base model (loops and noise score high)
        prompts = {r.id: r.input_ids[:r.prompt_len] for r in forget.main}
        out["forget_ppl_under_base"] = answer_perplexity(base, prompts, answered["tokens"],
                                                         tokenizer.pad_token_id)["value"]
    quantized, _ = quantized_copy(model)
    out["secret_quantised"] = greedy_leaks(text_of(tokenizer, forget.main, quantized), secrets)["value"]
    del quantized
    probe = relearning_probe(model, tokenizer, forget.main, forget.references, seed=0, secrets=secrets)
    out["secret_relearned"] = probe["points"][-1]["secret_leak"] if probe.get("points") else None
    return out


def run(source: str, forget, retain, sets, neighbour_ids, values: dict, method: str = "masc", base=None,
        preset: str | None = None) -> dict:
    started = time.perf_counter()
    params = MascParams.from_dict(values, preset=preset) if method == "masc" else params_for(method, values)
    outcome = run_unlearning(source, forget, retain, params=params)
    seconds = time.perf_counter() - started
    r = outcome.result.as_dict()
    row = {"stop_reason": r["stop_reason"], "steps": r["steps"], "seconds": round(seconds, 1),
           "alpha": (r.get("alpha") or {}).get("value"), "final_v": r.get("final_violation_rate"),
           "records_meeting_condition": (r.get("erasure") or {}).get("records_meeting_condition"),
           **measure(outcome.model, outcome.tokenizer, sets, neighbour_ids, base)}
    del outcome
    return row


def customers_block(log) -> list[dict]:
    groups = customer_records(27, seed=0)
    forget = [r for i in FORGET for r in groups[i]]
    unnamed = [{k: v for k, v in r.items() if k != "secrets"} for r in forget]
    retain = [r for i in RETAIN for r in groups[i]]
    neighbour_ids = {r["id"] for i in RETAIN if any(shares_a_name(groups[f], groups[i]) for f in FORGET)
                     for r in groups[i]}
    rows = []
    for arch in ARCHS:
        source = customer_fixture(arch, groups, log)
        base, tokenizer = load_model(source, torch.device("cpu"))
        max_length = context_length(base, tokenizer)
        # Utility from P and ROUGE-L only: these models never saw the paraphrased answers the truth ratio needs.
        plain = [{k: r[k] for k in ("id", "prompt", "completion")} for r in retain]
        sets = {"forget": EvaluationSet(forget, tokenizer, max_length, 0, "forget"),
                "retain": EvaluationSet(retain, tokenizer, max_length, 0, "retain"),
                "utility": EvaluationSet(plain, tokenizer, max_length, 0, "retain"),
                "secrets": request_secrets(forget, retain)}
        rows.append({"data": "customers", "arch": arch, "run": "base",
                     **measure(base, tokenizer, sets, neighbour_ids, base)})
        for name, values, method, preset in (*((name, values, "masc", preset) for name, values, preset in MASC_RUNS),
                                             *((f"{m} {BASELINES[m]}", BASELINES[m], m, None) for m in BASELINES)):
            log(f"{arch}: {name}")
            records = unnamed if "not named" in name else forget
            rows.append({"data": "customers", "arch": arch, "run": name,
                         **run(source, records, retain, sets, neighbour_ids, values, method, base, preset)})
        del base
    return rows


def tofu_block(log) -> list[dict]:
    full, base, tokenizer, data, sets = loaded(log)
    sets["secrets"] = request_secrets(data["forget"], data["retain"])
    reference = fixture("retain", log=log)
    rows = [{"data": "mini-TOFU", "arch": "qwen2", "run": "base", **measure(base, tokenizer, sets, set(), base)}]
    # The target a retrain would show: V of the reference (never saw the forget set) on the forget records.
    ref_model, _ = load_model(reference, torch.device("cpu"))
    ref_checks = Masc(MascParams(), Policy(ref_model, lora=False), tokenizer.pad_token_id).check_records(
        sets["forget"].main, 16)
    reference_v = sum(c.violation for c in ref_checks) / len(ref_checks)
    rows.append({"data": "mini-TOFU", "arch": "qwen2", "run": "retain reference",
                 "final_v": reference_v, **measure(ref_model, tokenizer, sets, set(), base)})
    # What alpha "auto" would be without the given perturbed answers (generated counterfactuals only).
    masc0 = Masc(MascParams(), Policy(base, lora=False), tokenizer.pad_token_id)
    stripped = [{k: v for k, v in r.items() if k != "perturbed_completions"} for r in data["forget"]]
    generated = calibrate("auto", "auto", stripped, data["retain"], [], 0, lambda records: [
        c.violation for c in masc0.check_records(
            [encode_record(r, tokenizer, max_length=512, seed=0, what="calibration") for r in records], 16)])
    rows.append({"data": "mini-TOFU", "arch": "qwen2", "run": "alpha from generated counterfactuals only",
                 "alpha": generated.alpha})
    del ref_model
    # TOFU names no secrets: the default suppresses whole records (secret_focus "auto").
    for name, values, preset in (("default (no parameters)", {}, None),
                                 ("preset secret-focus, seed 0", {}, "secret-focus"),
                                 ("defaults before issue 10", dict(OLD_DEFAULTS), None)):
        log(f"mini-TOFU: {name}")
        rows.append({"data": "mini-TOFU", "arch": "qwen2", "run": name,
                     **run(str(full), data["forget"], data["retain"], sets, set(), values, base=base, preset=preset)})
    return rows


def table(rows: list[dict]) -> str:
    columns = [("data", "data"), ("arch", "arch"), ("run", "run"), ("stop_reason", "stop"), ("steps", "steps"),
               ("seconds", "s"), ("alpha", "alpha"), ("final_v", "V at stop"),
               ("records_meeting_condition", "records meeting the condition"),
               ("forget_exact_match", "forget EM"), ("secret_greedy", "secret: greedy"),
               ("secret_sampled", "sampled"), ("secret_paraphrased", "paraphrased"),
               ("secret_quantised", "4-bit"), ("secret_relearned", "relearned"),
               ("forget_loops", "forget loops"), ("forget_distinct_2", "forget distinct-2"),
               ("forget_ppl_under_base", "forget answer ppl under base"),
               ("retain_loops", "retain loops"),
               ("retain_exact_match", "retain EM"), ("neighbour_exact_match", "neighbour EM"),
               ("other_exact_match", "other retain EM"), ("model_utility", "utility")]

    def cell(value):
        if value is None:
            return ""
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(key)) for key, _ in columns) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    """`--customers-only`: the customer-record block alone (minutes, not the mini-TOFU fixtures' half hour),
    into its own block of BENCHMARKS.md and bench/results/forgetting-customers.json; `--tofu-only`: the
    mini-TOFU block alone, likewise (forgetting-tofu)."""
    def log(line):
        print(line, file=sys.stderr, flush=True)

    torch.manual_seed(0)
    only = next((flag for flag in ("--customers-only", "--tofu-only") if flag in sys.argv), None)
    rows = (([] if only == "--tofu-only" else customers_block(log))
            + ([] if only == "--customers-only" else tofu_block(log)))
    name = {None: "forgetting", "--customers-only": "forgetting-customers", "--tofu-only": "forgetting-tofu"}[only]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"rows": rows, "versions": library_versions(),
                                                      "machine": platform.platform()}, indent=2))
    text = table(rows)
    print(text)
    command = f"`python -m bench.bench_forgetting {only}`" if only else "`make bench-forgetting`"
    update_benchmarks(name, f"## A deletion with no parameters: {command}\n\n"
                            f"Measured on {platform.machine()} ({torch.get_num_threads()} threads), CPU. "
                            f"Raw figures: `bench/results/{name}.json`. Secret columns: share of forget records "
                            f"whose secret comes out (sampled: share of {SAMPLES} samples per record).\n\n" + text)


if __name__ == "__main__":
    main()
