"""`make bench-forgetting`: does a job with no parameters erase every record, on models nobody tuned it for?

Synthetic customer records (worker.engine.customers: phone, address, occupation, account; namesakes on
purpose), base models of several architectures trained here until they reproduce every record, and
the default job through the engine, next to the old defaults (holdout D_val, alpha 0.2, lambda_forget
0.1, attention-only LoRA, uniform retain sampling) and two ablations of the new ones. Then the default
job on mini-TOFU (forget authors 198-199), where a retrain reference exists to check the calibrated
alpha against. Prints a table,
writes bench/results/forgetting.json and the block in BENCHMARKS.md. Nothing is asserted."""
from __future__ import annotations

import json
import platform
import sys
import time

import torch

from bench.mini_tofu import CACHE, ROOT, fixture, loaded, update_benchmarks
from worker.engine.audit import RecordSet, retain_utility
from worker.engine.calibration import calibrate
from worker.engine.customers import customer_records, shares_a_name
from worker.engine.evaluate import exact_match, greedy_continuations
from worker.engine.fixture import FixtureConfig, build_fixture
from worker.engine.loading import Policy, context_length, load_model
from worker.engine.methods.masc import Masc
from worker.engine.params import MascParams
from worker.engine.records import encode_record
from worker.engine.runtime import library_versions
from worker.engine.unlearn import run_unlearning

ARCHS = ["gpt2", "gpt_neox", "llama"]
FORGET, RETAIN, HOLDOUT = range(0, 3), range(3, 24), range(24, 27)  # customers: 12, 84 and 12 records
# The attention modules a user had to name by hand before targets were found automatically.
ATTENTION = {"gpt2": ["c_attn", "attn.c_proj"], "gpt_neox": ["query_key_value", "attention.dense"],
             "llama": ["q_proj", "k_proj", "v_proj", "o_proj"]}
OLD_DEFAULTS = {"val_mode": "holdout", "alpha": 0.2, "lambda_forget": 0.1, "max_steps": 500, "neighbour_share": 0.0}
RESULTS = ROOT / "bench" / "results"


def customer_fixture(arch: str, groups: list[list[dict]], log) -> str:
    out = CACHE / f"customers-{arch}"
    if not (out / "lethe_fixture.json").exists():
        log(f"building the {arch} customer-records model in {out}")
        trained = [r for i in (*FORGET, *RETAIN) for r in groups[i]]
        cfg = FixtureConfig(seed=0, epochs=300, vocab_size=768, hidden_size=128, layers=4, heads=4, arch=arch)
        build_fixture(trained, out, cfg, log=lambda _: None, tokenizer_records=[r for g in groups for r in g])
    return str(out)


def leaked(model, tokenizer, records, encoded) -> float:
    """Share of forget records whose secret (the phone number, the account, ...) appears in the greedy answer."""
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in greedy_continuations(model, tokenizer, encoded)]
    return sum(any(s in text for s in r["secrets"]) for r, text in zip(records, texts)) / len(records)


def measure(model, tokenizer, sets: dict, neighbour_ids: set[str]) -> dict:
    retain_em = exact_match(model, tokenizer, sets["retain"].main)["per_record"]
    near = [v for k, v in retain_em.items() if k in neighbour_ids]
    far = [v for k, v in retain_em.items() if k not in neighbour_ids]
    out = {"forget_exact_match": exact_match(model, tokenizer, sets["forget"].main)["value"],
           "retain_exact_match": sum(retain_em.values()) / len(retain_em),
           "neighbour_exact_match": sum(near) / len(near) if near else None,
           "other_exact_match": sum(far) / len(far) if far else None,
           "model_utility": retain_utility(model, tokenizer,
                                           sets.get("utility", sets["retain"]))["model_utility"]["value"]}
    if "secrets" in sets["forget"].records[0]:
        out["secret_leak"] = leaked(model, tokenizer, sets["forget"].records, sets["forget"].main)
    return out


def run(source: str, forget, retain, sets, neighbour_ids, values: dict) -> dict:
    started = time.perf_counter()
    outcome = run_unlearning(source, forget, retain, params=MascParams.from_dict(values))
    seconds = time.perf_counter() - started
    r = outcome.result
    row = {"stop_reason": r["stop_reason"], "steps": r["steps"], "seconds": round(seconds, 1),
           "alpha": r["alpha"]["value"], "final_v": r["final_violation_rate"],
           "records_meeting_condition": r["erasure"]["records_meeting_condition"],
           **measure(outcome.model, outcome.tokenizer, sets, neighbour_ids)}
    del outcome
    return row


def customers_block(log) -> list[dict]:
    groups = customer_records(27, seed=0)
    forget = [r for i in FORGET for r in groups[i]]
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
        sets = {"forget": RecordSet(forget, tokenizer, max_length, 0, "forget"),
                "retain": RecordSet(retain, tokenizer, max_length, 0, "retain"),
                "utility": RecordSet(plain, tokenizer, max_length, 0, "retain")}
        rows.append({"data": "customers", "arch": arch, "run": "base", **measure(base, tokenizer, sets, neighbour_ids)})
        del base
        for name, values in (("default (no parameters)", {}),
                             ("default, lambda_forget 0.1 (the paper's)", {"lambda_forget": 0.1}),
                             ("default, uniform retain batches", {"neighbour_share": 0.0}),
                             ("old defaults", {**OLD_DEFAULTS, "lora_targets": ATTENTION[arch]})):
            log(f"{arch}: {name}")
            rows.append({"data": "customers", "arch": arch, "run": name,
                         **run(source, forget, retain, sets, neighbour_ids, values)})
    return rows


def tofu_block(log) -> list[dict]:
    full, base, tokenizer, data, sets = loaded(log)
    reference = fixture("retain", log=log)
    rows = [{"data": "mini-TOFU", "arch": "qwen2", "run": "base", **measure(base, tokenizer, sets, set())}]
    # The target a retrain would show: V of the reference (never saw the forget set) on the forget records.
    ref_model, _ = load_model(reference, torch.device("cpu"))
    ref_checks = Masc(MascParams(), Policy(ref_model, lora=False), tokenizer.pad_token_id).check_records(
        sets["forget"].main, 16)
    reference_v = sum(c.violation for c in ref_checks) / len(ref_checks)
    rows.append({"data": "mini-TOFU", "arch": "qwen2", "run": "retain reference",
                 "final_v": reference_v, **measure(ref_model, tokenizer, sets, set())})
    # What alpha "auto" would be without the given perturbed answers (generated counterfactuals only).
    masc0 = Masc(MascParams(), Policy(base, lora=False), tokenizer.pad_token_id)
    stripped = [{k: v for k, v in r.items() if k != "perturbed_completions"} for r in data["forget"]]
    generated = calibrate("auto", "auto", stripped, data["retain"], [], 0, lambda records: [
        c.violation for c in masc0.check_records(
            [encode_record(r, tokenizer, max_length=512, seed=0, what="calibration") for r in records], 16)])
    rows.append({"data": "mini-TOFU", "arch": "qwen2", "run": "alpha from generated counterfactuals only",
                 "alpha": generated.alpha})
    del base, ref_model
    for name, values in (("default (no parameters)", {}), ("old defaults", dict(OLD_DEFAULTS))):
        log(f"mini-TOFU: {name}")
        rows.append({"data": "mini-TOFU", "arch": "qwen2", "run": name,
                     **run(str(full), data["forget"], data["retain"], sets, set(), values)})
    return rows


def table(rows: list[dict]) -> str:
    columns = [("data", "data"), ("arch", "arch"), ("run", "run"), ("stop_reason", "stop"), ("steps", "steps"),
               ("seconds", "s"), ("alpha", "alpha"), ("final_v", "V at stop"),
               ("records_meeting_condition", "records meeting the condition"),
               ("forget_exact_match", "forget EM"), ("secret_leak", "secret in greedy answer"),
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
    def log(line):
        print(line, file=sys.stderr, flush=True)

    torch.manual_seed(0)
    rows = customers_block(log) + tofu_block(log)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "forgetting.json").write_text(json.dumps({"rows": rows, "versions": library_versions(),
                                                         "machine": platform.platform()}, indent=2))
    text = table(rows)
    print(text)
    update_benchmarks("forgetting", "## A deletion with no parameters: `make bench-forgetting`\n\n"
                                    f"Measured on {platform.machine()} ({torch.get_num_threads()} threads), CPU. "
                                    "Raw figures: `bench/results/forgetting.json`.\n\n" + text)


if __name__ == "__main__":
    main()
