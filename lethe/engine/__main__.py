"""The engine's CLI: `python -m lethe.engine fixture|unlearn|connectivity ...`."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from lethe.engine.connectivity.params import ConnectivityParams
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.parameters import help_of, user_fields
from lethe.engine.methods import METHODS, all_presets, params_for


def flag_help(name: str) -> str:
    """A parameter flag's help: what it does, its rule and its default, per method where they differ."""
    groups: dict[str, list[str]] = {}  # help text -> the methods it applies to
    defaults: dict[str, list[str]] = {}  # default -> the methods with it
    for method in METHODS.values():
        spec = next((f for f in user_fields(method.params) if f.name == name), None)
        if spec is not None:
            groups.setdefault(help_of(spec), []).append(method.name)
            defaults.setdefault(repr(method.defaults.get(name, spec.default)), []).append(method.name)
    texts = [text if len(groups) == 1 else f"{', '.join(names)}: {text}" for text, names in groups.items()]
    shown = [d if len(defaults) == 1 else f"{', '.join(names)} {d}" for d, names in defaults.items()]
    return "; ".join(texts) + f" [default: {'; '.join(shown)}]"


# Every parameter of every method is a flag; params_for refuses those the chosen method lacks.
PARAM_NAMES = list(dict.fromkeys(f.name for m in METHODS.values() for f in user_fields(m.params)))


FORMAT_HELP = ("\"plain\": prompt + completion as one string; \"chat\": rendered with the tokenizer's chat template "
               "(a user and an assistant turn; the answer is what is scored) [default: plain]")


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m lethe.engine", description="Lethe unlearning engine")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    fixture = commands.add_parser("fixture", help="build and train a small fixture model on records")
    fixture.add_argument("--records", required=True)
    fixture.add_argument("--out", required=True)
    fixture.add_argument("--seed", type=int, default=0)
    fixture.add_argument("--epochs", type=int, default=60)
    fixture.add_argument("--hidden-size", type=int, default=256)
    fixture.add_argument("--layers", type=int, default=4)
    fixture.add_argument("--vocab-size", type=int, default=2048)
    fixture.add_argument("--arch", default="qwen2",
                         help="any causal-LM model type of the installed transformers (gpt2, gpt_neox, llama, ...)")
    fixture.add_argument("--split", default="auto", choices=["auto", "digits", "gpt2"],
                         help="tokenizer pre-tokenisation: digits one by one, GPT-2's digit runs, or by arch")
    fixture.add_argument("--base", default="",
                         help="a from_pretrained directory to fine-tune on the records instead of a model built "
                              "from scratch (its tokenizer kept; the size, arch and split options are ignored)")
    fixture.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (2e-4 suits a --base)")

    unlearn = commands.add_parser("unlearn", help="run MASC until its stop rule fires, or a baseline's budget")
    unlearn.add_argument("--model", required=True, help="a from_pretrained directory or hub id")
    unlearn.add_argument("--forget", required=True)
    unlearn.add_argument("--retain")
    unlearn.add_argument("--holdout", help="records the model never saw: membership baseline and alpha calibration")
    unlearn.add_argument("--out", required=True)
    # Checked by the registry, like a request's: one rule, one message.
    unlearn.add_argument("--preset", help="published or named values: " + ", ".join(all_presets()))
    unlearn.add_argument("--method", default="masc",
                         help="; ".join(f"{m.name}: {m.summary}" for m in METHODS.values()) + " [default: masc]")
    unlearn.add_argument("--device", default="auto")
    unlearn.add_argument("--format", default="plain", help=FORMAT_HELP)
    unlearn.add_argument("--full", action="store_true", help="full fine-tuning with a frozen copy: --lora false")
    unlearn.add_argument("--no-progress", action="store_true")
    for name in PARAM_NAMES:
        unlearn.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar="V",
                             help=flag_help(name).replace("%", "%%"))

    curve = commands.add_parser("connectivity", help="the curve between two versions: barriers, analysis")
    curve.add_argument("--a", required=True, help="the version at t = 0 (a from_pretrained directory)")
    curve.add_argument("--b", required=True, help="the version at t = 1")
    curve.add_argument("--forget")
    curve.add_argument("--retain")
    curve.add_argument("--out", required=True, help="a JSON file for the result")
    curve.add_argument("--ensemble-out", help="a new directory for the MCU ensemble (implies --ensemble true)")
    curve.add_argument("--device", default="auto")
    curve.add_argument("--format", default="plain", help=FORMAT_HELP)
    for f in user_fields(ConnectivityParams):
        curve.add_argument("--" + f.name.replace("_", "-"), dest="mcu_" + f.name, default=None, metavar="V",
                           help=f"{help_of(f)} [default: {f.default!r}]".replace("%", "%%"))
    return parser


def prepare_out(out: Path) -> Path:
    """OUT must be new or empty; work happens in a sibling temporary directory moved in at the end."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EngineInputError(f"--out {out}: exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))


def commit_out(staging: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()
    staging.rename(out)


def cmd_fixture(args) -> int:
    from lethe.engine.contract.record_checks import read_records
    from lethe.engine.model.fixture import FixtureConfig, build_fixture

    records = read_records(args.records)
    out = Path(args.out)
    staging = prepare_out(out)
    try:
        cfg = FixtureConfig(seed=args.seed, epochs=args.epochs, hidden_size=args.hidden_size, layers=args.layers,
                            vocab_size=args.vocab_size, arch=args.arch, split=args.split, base=args.base, lr=args.lr)
        summary = build_fixture(records, staging, cfg, log=lambda line: print(line, file=sys.stderr))
        commit_out(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(json.dumps(summary))
    return 0


def cmd_unlearn(args) -> int:
    from tqdm import tqdm

    from lethe.engine.contract.record_checks import read_records
    from lethe.engine.model.loading import save_model
    from lethe.engine.training.result import RuleEvidence
    from lethe.engine.unlearn import run_unlearning

    values = {name: getattr(args, name) for name in PARAM_NAMES if getattr(args, name) is not None}
    if args.full:
        values["lora"] = False
    params = params_for(args.method, values, preset=args.preset)
    forget = read_records(args.forget)
    retain = read_records(args.retain) if args.retain else []
    holdout = read_records(args.holdout) if args.holdout else []
    out = Path(args.out)
    staging = prepare_out(out)
    try:
        bar = tqdm(unit="step", disable=args.no_progress, file=sys.stderr)

        def progress(p):
            bar.total = p["max_steps"]
            bar.update(p["step"] - bar.n)
            v = p["violation_rate"]
            bar.set_postfix(loss=f"{p['losses']['total']:.4f}", V="-" if v is None else f"{v:.3f}")

        outcome = run_unlearning(args.model, forget, retain, holdout=holdout, params=params, device=args.device,
                                 progress=progress, format=args.format)
        bar.close()
        if outcome.model is not None:
            save_model(outcome.model, outcome.tokenizer, staging / "model")
        (staging / "result.json").write_text(json.dumps(outcome.result.as_dict(), indent=2))
        commit_out(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    r = outcome.result
    evidence = r.measured.evidence
    alpha = evidence.alpha.get("value") if isinstance(evidence, RuleEvidence) else None
    print(f"stop_reason={r.stop_reason} steps={r.steps} V={r.final_violation_rate} alpha={alpha} "
          f"wall_seconds={r.wall_seconds:.1f} out={out}")
    return 0


def cmd_connectivity(args) -> int:
    from lethe.engine.connectivity.run import run_connectivity
    from lethe.engine.contract.record_checks import read_records
    from lethe.engine.data.inputs import RunInputs
    from lethe.engine.model.loading import save_model

    values = {f.name: getattr(args, "mcu_" + f.name) for f in user_fields(ConnectivityParams)
              if getattr(args, "mcu_" + f.name) is not None}  # text; ConnectivityParams.from_dict coerces and checks
    if args.ensemble_out:
        values["ensemble"] = True
        staging = prepare_out(Path(args.ensemble_out))
    params = ConnectivityParams.from_dict(values)
    forget = read_records(args.forget) if args.forget else None
    retain = read_records(args.retain) if args.retain else None
    try:
        inputs = RunInputs.of(forget, retain, format=args.format, forget_required=False)
        outcome = run_connectivity(args.a, args.b, inputs, params, device=args.device)
        Path(args.out).write_text(json.dumps(outcome.result, indent=2))
        if args.ensemble_out:
            save_model(outcome.ensemble, outcome.tokenizer, staging)
            commit_out(staging, Path(args.ensemble_out))
    finally:
        if args.ensemble_out:
            shutil.rmtree(staging, ignore_errors=True)
    b = outcome.result["barriers"]
    print(f"B_r={b['retain']['value']} B_f={b['forget']['value']} mcu_holds={b['mcu_holds']} out={args.out}")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"fixture": cmd_fixture, "unlearn": cmd_unlearn, "connectivity": cmd_connectivity}[args.command](args)
    except EngineInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
