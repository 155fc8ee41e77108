"""`make bench-engine`: the cost of a MASC step against a plain NLL step on the same rows (the default job, whose
forget rows carry their sparse targets, and the tofu-llama2 preset), the stop rule's and the replays' share of wall
time, and the peak memory of LoRA against full fine-tuning, on the mini-TOFU fixture; then the step cost and the
checks' share of a run on pretrained-size models (`--pretrained-size`, bench/results/engine-pretrained-size.json): the
step cost on a model of SmolLM2-135M's shape (135 M parameters, a 49,152-token vocabulary, random weights, the
mini-TOFU tokenizer), the checks' share on a default job that erases 12 plain customer records from
SmolLM2-135M-Instruct fine-tuned on them (make bench-forgetting's base; random weights memorise nothing, so no rule
would have work to do). Figures are printed and written to bench/results/engine.json; nothing here is asserted."""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.mini_tofu import ROOT, fixture, splits
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import collate, concat_batches, encode_records
from lethe.engine.methods.masc import margin as M
from lethe.engine.methods.masc.content import said_template
from lethe.engine.methods.masc.destination import plan_contents, record_targets
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.loading import TrainableModel, autocast, load_model
from lethe.engine.training.runtime import PeakMemory, library_versions
from lethe.engine.unlearn import run_unlearning

PRESET = "tofu-llama2"
RESULTS = ROOT / "bench" / "results" / "engine.json"


def prepared(model_dir: Path, lora: bool, batch_size: int, preset: str | None = PRESET):
    """Model, policy, MASC and optimiser as the trainer builds them, and one fixed forget/retain batch; with the
    default job (preset None) the forget rows carry their content focus and sparse targets, as in training."""
    device = torch.device("cpu")
    model, tokenizer = load_model(model_dir, device)
    data = splits()

    def encode(what):
        return encode_records(normalise_records(data[what], what), tokenizer, max_length=512, seed=0, what=what)

    params = MascParams.from_dict({"lora": lora, "batch_size": batch_size}, preset=preset).resolved()
    trainable = TrainableModel(model, lora=lora, targets=params.lora_targets)
    masc = Masc(params, trainable, tokenizer.pad_token_id)
    optimiser = torch.optim.AdamW(trainable.trainable_parameters(), lr=params.lr)
    forget_records = encode("forget")[:batch_size]
    if params.content:
        template = said_template(data["forget"], data["retain"])
        contents = plan_contents(forget_records, tokenizer, trainable.reference_logits, device, template,
                                 data["forget"] + data["retain"], min_gain=params.min_gain, max_length=512, seed=0)
        record_targets(forget_records, contents, trainable.reference_logits, device, tokenizer.pad_token_id)
    forget = collate(forget_records, tokenizer.pad_token_id)
    retain = collate(encode("retain")[:batch_size], tokenizer.pad_token_id)
    return trainable, masc, optimiser, forget, retain, tokenizer


def step(optimiser, trainable, loss):
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable.trainable_parameters(), 1.0)
    optimiser.step()


def step_cost(model_dir: Path, lora: bool, batch_size: int = 4, rounds: int = 8, per_round: int = 5,
              preset: str | None = None) -> dict:
    """Alternate blocks of MASC and plain NLL steps on the same batch; compare median step times."""
    trainable, masc, optimiser, forget, retain, tokenizer = prepared(model_dir, lora, batch_size, preset)
    joint = concat_batches(forget, retain, tokenizer.pad_token_id)

    def masc_step():
        with autocast(forget.input_ids.device):
            loss, _ = masc.loss(forget, retain)
        step(optimiser, trainable, loss)

    def nll_step():
        z, y, _ = M.active_positions(trainable.logits(joint), joint.labels)
        step(optimiser, trainable, M.token_nll(z, y))

    times = {"masc": [], "nll": []}
    for fn in (masc_step, nll_step, masc_step, nll_step):  # warm-up
        fn()
    for _ in range(rounds):
        for name, fn in (("masc", masc_step), ("nll", nll_step)):
            start = time.perf_counter()
            for _ in range(per_round):
                fn()
            times[name].append((time.perf_counter() - start) / per_round)
    masc_s, nll_s = statistics.median(times["masc"]), statistics.median(times["nll"])
    return {"job": preset or "default", "mode": "lora" if lora else "full",
            "batch": f"{batch_size} forget + {batch_size} retain",
            "masc_step_ms": round(masc_s * 1000, 2), "nll_step_ms": round(nll_s * 1000, 2),
            "ratio": round(masc_s / nll_s, 3)}


def stop_rule_share(model_dir: Path, preset: str | None = None, values: dict | None = None) -> dict:
    """A whole run: the share of the training loop spent in the rule's checks and (default job) the replays."""
    data = splits()
    params = MascParams.from_dict({"max_steps": 1000, **(values or {})}, preset=preset)
    r = run_unlearning(str(model_dir), data["forget"], data["retain"], params=params, device="cpu").result.as_dict()
    t = r["timing"]
    return {"job": preset or "default", "values": values or {}, "stop_reason": r["stop_reason"], "steps": r["steps"],
            "checks": len(r["v_trace"]), "final_v": r["final_violation_rate"], "validation": r["validation"],
            "setup_seconds": round(t["load_seconds"], 2),
            "loop_seconds": round(t["loop_seconds"], 2), "stop_check_seconds": round(t["stop_check_seconds"], 2),
            "share": round(t["stop_check_seconds"] / t["loop_seconds"], 4)}


def pretrained_size_model() -> Path:
    """A model of SmolLM2-135M's shape (Llama, 30 layers, hidden 576, a 49,152-token vocabulary) with random weights
    and the mini-TOFU tokenizer: the cost of a step does not depend on what the weights know."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = ROOT / "bench" / ".fixtures" / "pretrained-size"
    if not (out / "config.json").exists():
        source = fixture("full", log=lambda line: print(line, file=sys.stderr))
        tokenizer = AutoTokenizer.from_pretrained(source)
        config = AutoConfig.for_model("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                      max_position_embeddings=2048, tie_word_embeddings=True,
                                      bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


def pretrained_run() -> dict:
    """The default job on SmolLM2-135M-Instruct fine-tuned on the customer records: where its wall time went."""
    from bench.bench_forgetting import FORGET, RETAIN, customer_fixture
    from lethe.engine.data.customers import customer_records

    groups = customer_records(27, seed=0)
    source = customer_fixture("smollm2", groups, log=lambda line: print(line, file=sys.stderr))
    plain = [{k: v for k, v in r.items() if k != "secrets"} for i in FORGET for r in groups[i]]
    r = run_unlearning(source, plain, [r for i in RETAIN for r in groups[i]], device="cpu").result.as_dict()
    t = r["timing"]
    return {"job": "default, 12 plain records", "model": "SmolLM2-135M-Instruct fine-tuned on the customer records",
            "stop_reason": r["stop_reason"], "steps": r["steps"], "wall_seconds": round(t["wall_seconds"], 1),
            "setup_seconds": round(t["load_seconds"], 1), "calibration_seconds": round(t["calibration_seconds"], 1),
            "loop_seconds": round(t["loop_seconds"], 1), "stop_check_seconds": round(t["stop_check_seconds"], 1),
            "share_of_loop": round(t["stop_check_seconds"] / t["loop_seconds"], 4),
            "share_of_wall": round(t["stop_check_seconds"] / t["wall_seconds"], 4),
            "served_checks": (r.get("erasure") or {}).get("served_checks")}


def memory_probe(model_dir: Path, lora: bool, steps: int = 10) -> dict:
    """Run in a fresh process: peak RSS of a few MASC steps, and the bytes of every tensor the mode holds."""
    peak = PeakMemory(torch.device("cpu"))
    trainable, masc, optimiser, forget, retain, _ = prepared(model_dir, lora, 4)
    for _ in range(steps):
        loss, _ = masc.loss(forget, retain)
        step(optimiser, trainable, loss)
    tensors = {id(p): p for p in trainable.model.parameters()}
    if trainable.frozen is not None:
        tensors.update({id(p): p for p in trainable.frozen.parameters()})
    tensors.update({id(p.grad): p.grad for p in trainable.trainable_parameters() if p.grad is not None})
    for state in optimiser.state.values():
        tensors.update({id(v): v for v in state.values() if torch.is_tensor(v)})
    return {"mode": "lora" if lora else "full", "peak_rss_bytes": peak.read()["bytes"],
            "tensor_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "trainable_parameters": sum(p.numel() for p in trainable.trainable_parameters()),
            "frozen_copy": trainable.frozen is not None}


def memory_comparison(model_dir: Path) -> dict:
    rows = {}
    for mode in ("lora", "full"):
        out = subprocess.run([sys.executable, "-m", "bench.bench_engine", "--memory-probe", mode, "--model",
                              str(model_dir)], capture_output=True, text=True, cwd=ROOT, check=True)
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    rows["full_over_lora_peak_rss"] = round(rows["full"]["peak_rss_bytes"] / rows["lora"]["peak_rss_bytes"], 3)
    rows["full_over_lora_tensor_bytes"] = round(rows["full"]["tensor_bytes"] / rows["lora"]["tensor_bytes"], 3)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-probe", choices=["lora", "full"])
    parser.add_argument("--model")
    parser.add_argument("--pretrained-size", action="store_true",
                        help="only the step cost and the checks' share on 135 M-parameter models")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.memory_probe:
        print(json.dumps(memory_probe(Path(args.model), args.memory_probe == "lora")))
        return
    model_dir = fixture("full", log=lambda line: print(line, file=sys.stderr))
    summary = json.loads((model_dir / "lethe_fixture.json").read_text())
    report = {"command": "make bench-engine",
              "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, CPU",
              "fixture": {k: summary[k] for k in ("parameters", "epochs", "memorised_fraction", "records")},
              "versions": library_versions()}
    if args.pretrained_size:
        big = pretrained_size_model()
        report["pretrained_size"] = {
            "parameters": sum(p.numel() for p in load_model(big, torch.device("cpu"))[0].parameters()),
            "step_cost": [step_cost(big, lora=True, rounds=3, per_round=2)],
            "run": pretrained_run()}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        path = RESULTS.with_name("engine-pretrained-size.json")
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report["pretrained_size"], indent=2))
        return
    report["step_cost"] = [step_cost(model_dir, lora=True), step_cost(model_dir, lora=False),
                           step_cost(model_dir, lora=True, preset=PRESET)]
    report["stop_rule"] = [stop_rule_share(model_dir), stop_rule_share(model_dir, PRESET)]
    report["memory"] = memory_comparison(model_dir)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)


def print_report(r: dict) -> None:
    print(f"mini-TOFU fixture: {r['fixture']['parameters']:,} parameters, "
          f"memorised {r['fixture']['memorised_fraction']:.0%}")
    for row in r["step_cost"]:
        print(f"step cost ({row['job']}, {row['mode']}, {row['batch']}): MASC {row['masc_step_ms']} ms, NLL "
              f"{row['nll_step_ms']} ms, ratio {row['ratio']} (target <= 1.3)")
    for s in r["stop_rule"]:
        print(f"stop rule and replays ({s['job']}): {s['stop_reason']} after {s['steps']} steps, {s['checks']} checks, "
              f"{s['stop_check_seconds']} s of {s['loop_seconds']} s = {s['share']:.1%} (target <= 10%)")
    m = r["memory"]
    for mode in ("lora", "full"):
        print(f"memory ({mode}): peak RSS {m[mode]['peak_rss_bytes'] / 2**20:.1f} MiB, tensors held "
              f"{m[mode]['tensor_bytes'] / 2**20:.1f} MiB, frozen copy: {m[mode]['frozen_copy']}")
    print(f"full / LoRA: peak RSS x{m['full_over_lora_peak_rss']}, tensors held x{m['full_over_lora_tensor_bytes']}")
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
