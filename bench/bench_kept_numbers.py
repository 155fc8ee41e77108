"""Do answers to erased customers' questions say a KEPT customer's number, and does the retrain reference (a model
that never saw the erased customers) do the same? The customers fixtures of bench_forgetting, plain records, the
default job (seed 0); greedy answers to the erased records whose completion holds a number the audit's digit test
can match (secrets.digits_can_leak).

    python -m bench.bench_kept_numbers gpt2,llama
"""
import sys

import torch

from bench.bench_forgetting import FORGET, RETAIN, customer_fixture
from lethe.engine.audit.measurements import EvaluationSet
from lethe.engine.audit.metrics.text import generation_metrics
from lethe.engine.data.customers import customer_records
from lethe.engine.data.secrets import digits_can_leak, digits_leak
from lethe.engine.methods import params_for
from lethe.engine.model.loading import context_length, load_model
from lethe.engine.unlearn import run_unlearning


def answers(model, tok, plain: list[dict]) -> dict[str, str]:
    chosen = EvaluationSet(plain, tok, context_length(model, tok), 0, "forget")
    return generation_metrics(model, tok, chosen.main, chosen.references)["generated"]


def kept_said(gen: dict[str, str], retain: list[dict]) -> dict[str, tuple[str, list[str]]]:
    """The answers that give back a kept customer's number (the audit's digit test), with whose."""
    out: dict[str, tuple[str, list[str]]] = {}
    for rid, text in gen.items():
        whose = [r["id"] for r in retain if digits_leak(r["completion"], text)]
        if whose:
            out[rid] = (text, whose)
    return out


def main() -> None:
    torch.manual_seed(0)
    groups = customer_records(27, seed=0)
    named = [r for i in FORGET for r in groups[i]]
    plain = [{k: v for k, v in r.items() if k != "secrets"} for r in named]
    retain = [r for i in RETAIN for r in groups[i]]
    numbered = [r["id"] for r in plain if digits_can_leak(r["completion"])]
    for arch in sys.argv[1].split(",") if len(sys.argv) > 1 else ["gpt2", "llama"]:
        base_dir = customer_fixture(arch, groups, print)
        reference, tok = load_model(customer_fixture(arch, groups, print, reference=True), torch.device("cpu"))
        reference_answers = {k: v for k, v in answers(reference, tok, plain).items() if k in numbered}
        outcome = run_unlearning(base_dir, plain, retain, params=params_for("masc", {}, None))
        erased_answers = {k: v for k, v in answers(outcome.model, outcome.tokenizer, plain).items() if k in numbered}
        result = outcome.result.as_dict()
        print(f"== {arch}: {len(numbered)} erased records with a number; stop {result['stop_reason']} at "
              f"{result['steps']} steps")
        for who, gen in (("retrain reference", reference_answers), ("erased", erased_answers)):
            said = kept_said(gen, retain)
            print(f"  {who}: {len(said)}/{len(gen)} answers say a kept customer's number")
            for rid, (text, ids) in said.items():
                print(f"    {rid}: {text!r} <- {ids}")


if __name__ == "__main__":
    main()
