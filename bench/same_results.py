"""`python -m bench.same_results OUT [--against DIR]`: does a change keep the engine's behaviour?

Runs sixteen fixed engine configurations (MASC's default, its presets, holdout mode, the Hoeffding bound,
named secrets, full fine-tuning; every baseline, RMU also in full) on the test suite's tiny fixture, and
writes each result (timings, library versions and the temporary model path left out) with the sha256 of the
merged weights to OUT. Run it before and after a refactor and compare with --against: identical files mean
the same steps, the same measurements and the same weights, bit for bit (CPU, same torch)."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

from lethe.engine.data.synthetic import synthetic_people
from lethe.engine.methods import METHODS, params_for
from lethe.engine.model.fixture import FixtureConfig, build_fixture
from lethe.engine.unlearn import run_unlearning

TINY = FixtureConfig(seed=0, epochs=300, vocab_size=512, hidden_size=64, layers=2, heads=4)  # tests/conftest.py
BASELINE_BUDGET = {"epochs": 2, "effective_batch": 8}


def runs(forget: list[dict], named: list[dict]) -> list[tuple[str, str, dict, str | None, list[dict]]]:
    return [
        ("masc_default", "masc", {"max_steps": 120}, None, forget),
        ("masc_fast", "masc", {"lr": 1e-3, "max_steps": 400}, None, forget),
        ("masc_hoeffding", "masc", {"lr": 1e-3, "max_steps": 300, "hoeffding": True, "alpha": 0.5,
                                             "val_mode": "holdout"}, None, forget),
        ("masc_named_fast", "masc", {"lr": 1e-3, "max_steps": 300}, None, named),
        ("masc_holdout", "masc", {"val_mode": "holdout", "max_steps": 20, "lr": 1e-3}, None, forget),
        ("masc_whole_record", "masc", {"max_steps": 30}, "whole-record", forget),
        ("masc_named", "masc", {"max_steps": 40}, None, named),
        ("masc_muse", "masc", {"max_steps": 20}, "muse-news", forget),
        ("masc_full", "masc", {"max_steps": 15, "lora": False, "lr": 1e-4}, None, forget),
        *((f"b_{m.name}", m.name, BASELINE_BUDGET, None, forget) for m in METHODS.values() if m.stop == "fixed-budget"),
        ("b_rmu_full", "rmu", {"lora": False, "lr": 1e-3, "epochs": 2, "effective_batch": 4, "rmu_layer": 1}, None,
         forget),
    ]


def weights_sha256(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--against", type=Path, help="a folder an earlier run wrote: report what differs")
    args = parser.parse_args()
    torch.set_num_threads(2)
    people = synthetic_people(8, seed=0)
    forget = [r for p in people[:2] for r in p]
    retain = [r for p in people[2:] for r in p]
    named = [dict(r, secrets=[r["completion"].split()[-1].strip(".")]) if i % 2 == 0 else r
             for i, r in enumerate(forget)]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fixture = Path(tmp) / "fixture"
        build_fixture([r for p in people for r in p], fixture, TINY, log=lambda _: None)
        for name, method, values, preset, records in runs(forget, named):
            outcome = run_unlearning(str(fixture), records, retain, params=params_for(method, values, preset),
                                     device="cpu")
            result = outcome.result.as_dict()
            for key in ("timing", "wall_seconds", "peak_memory", "versions", "engine_version", "model"):
                result.pop(key, None)
            result["weights_sha256"] = weights_sha256(outcome.model) if outcome.model is not None else None
            (args.out / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
            print(f"{name}: {result['stop_reason']} at step {result['steps']}, V {result['final_violation_rate']}",
                  file=sys.stderr, flush=True)
    if args.against is None:
        return 0
    differ = [p.name for p in sorted(args.out.glob("*.json"))
              if not (args.against / p.name).exists() or (args.against / p.name).read_text() != p.read_text()]
    print("same results" if not differ else "differ: " + ", ".join(differ))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
