"""One connectivity run between two versions: load both, build the path (fit the control point for a
Bezier curve), measure T points, compute barriers, the suppress-first analysis and, when asked, the
MCU ensemble. Returns a JSON-able result and the ensemble model (or None)."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from lethe.engine.audit.measurements import EvaluationSet, evaluate, retain_utility
from lethe.engine.audit.metrics import metric_value
from lethe.engine.connectivity.barriers import barriers, chord, suppress_first
from lethe.engine.connectivity.curve import evaluate_path
from lethe.engine.connectivity.fit import fit_control_point
from lethe.engine.connectivity.params import ConnectivityParams
from lethe.engine.connectivity.paths import ControlPoint, Path, differing_names, load_weights, parameters_of
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.data.inputs import RunInputs
from lethe.engine.model.loading import context_length, load_model, lora_modules, resolve_device
from lethe.engine.training.runtime import PeakMemory, library_versions, seed_everything


@dataclass
class ConnectivityOutcome:
    result: dict
    ensemble: object | None  # a transformers model holding the ensemble's weights
    tokenizer: object


def run_connectivity(start_source: str, end_source: str, inputs: RunInputs, params: ConnectivityParams | None = None,
                     *, device: str | None = None, suppress: bool = True, control_init: str | None = None,
                     progress=None, should_cancel=None) -> ConnectivityOutcome:
    """`inputs`: the request's records (forget may be empty: retain alone is measured) and their format.
    `suppress`: also measure knowledge memorisation along the linear path (the suppress-first analysis).
    `control_init`: a version whose weights start theta_c instead of the midpoint."""
    params = params or ConnectivityParams()  # checked where it was built (from_dict, a job's specification)
    seed_everything(params.seed)
    dev = resolve_device(device)
    memory, started = PeakMemory(dev), time.perf_counter()
    model, tokenizer = load_model(start_source, dev)
    end_model, end_tokenizer = load_model(end_source, dev)
    if end_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise EngineInputError("the two versions have different tokenizers; a path needs one vocabulary", field="b")
    start_weights, end_weights = parameters_of(model), parameters_of(end_model)
    try:
        names = differing_names(start_weights, end_weights)
    except ValueError as exc:
        raise EngineInputError(f"the two versions cannot be connected: {exc}", field="b") from None
    start = {n: start_weights[n].clone() for n in names}  # the model's own tensors are overwritten along the way
    end = {n: end_weights[n].clone() for n in names}
    del end_model, end_weights
    init = None
    if control_init is not None:
        init_model, _ = load_model(control_init, dev)
        init = {n: w.clone() for n, w in parameters_of(init_model).items() if n in start}
        del init_model

    max_length = context_length(model, tokenizer, params.max_length)
    tokens = inputs.tokenised(tokenizer, max_length, params.seed)  # the run's encodings, when it shares the tokenizer
    forget, retain = tokens.forget, tokens.retain
    forget_set = (EvaluationSet(forget, tokenizer, max_length, params.seed, "forget", tokens.records("forget"))
                  if forget else None)
    # A seeded sample of the retain records (the same positions of the records and of their encodings).
    picked = (random.Random(params.seed).sample(list(zip(retain, tokens.records("retain"))),
                                                min(params.max_retain, len(retain))) if retain else [])
    sample, retain_enc = [r for r, _ in picked], [e for _, e in picked]

    curve = params.curve if names else "linear"  # identical ends: there is nothing to bend
    space = choose_space(params.space, names, start, set(lora_modules(model, "auto")))
    control = (ControlPoint(start, end, names, space, params.lora_r, init, params.seed).to(dev)
               if curve == "bezier" else None)
    path = Path(start, end, names, curve, control)
    result: dict = {"curve": params.curve, "space": space if params.curve == "bezier" else None,
                    "differing_tensors": len(names),
                    "differing_parameters": sum(start[n].numel() for n in names),
                    "counts": {"forget": len(forget), "retain": len(retain_enc)}, "params": params.as_dict(),
                    "versions": library_versions()}
    if not names:
        result["note"] = "the two versions have identical weights"
    timing: dict = {}
    if curve == "bezier":
        fit = fit_control_point(model, tokenizer, path, forget_set.main if forget_set else [], retain_enc,
                                params, should_cancel, progress)
        timing["fit_seconds"] = fit["seconds"]
        result["fit"] = {"steps": fit["steps"], "loss_trace": fit["loss_trace"]}
    t0 = time.perf_counter()
    linear_knowledge = suppress and curve == "linear"
    rows = evaluate_path(model, tokenizer, path, params.ts, params, forget=forget_set, retain=retain_enc,
                         knowledge=linear_knowledge, should_cancel=should_cancel, progress=progress)
    timing["evaluation_seconds"] = time.perf_counter() - t0
    result["points"] = rows
    lines = {f"{k}_line": chord(rows, k) for k in ("retain_nll", "forget_nll") if all(k in r for r in rows)}
    result["line"] = [{"t": r["t"], **{name: values[i] for name, values in lines.items()}} for i, r in enumerate(rows)]
    result["barriers"] = barriers(rows, params.tolerance)
    if suppress and forget_set is not None:
        linear_rows = rows
        if curve != "linear":  # the analysis is defined on the straight line from parent to new version
            t0 = time.perf_counter()
            linear_rows = evaluate_path(model, tokenizer, Path(start, end, names, "linear"), params.ts, params,
                                        forget=forget_set, knowledge=True, should_cancel=should_cancel)
            timing["suppress_seconds"] = time.perf_counter() - t0
            result["suppress_points"] = linear_rows
        result["suppress_first"] = suppress_first(linear_rows, params.suppress_fraction, params.min_drop)
    elif suppress:
        result["suppress_first"] = {"first": None, "reason": "no forget records"}

    ensemble_model = None
    if params.ensemble:
        load_weights(model, path.ensemble(params.ensemble_points))
        ensemble_model = model
        t0 = time.perf_counter()
        retain_set = EvaluationSet(sample, tokenizer, max_length, params.seed, "retain", retain_enc) if sample else None
        result["ensemble"] = {"points": params.ensemble_points,
                              "t": [(i + 1) / (params.ensemble_points + 1) for i in range(params.ensemble_points)],
                              "evaluation": evaluate_version(model, tokenizer, forget_set, retain_set)}
        timing["ensemble_seconds"] = time.perf_counter() - t0
    timing["wall_seconds"] = time.perf_counter() - started
    result["timing"] = timing
    result["peak_memory"] = memory.read()
    return ConnectivityOutcome(result=result, ensemble=ensemble_model, tokenizer=tokenizer)


def choose_space(requested: str, names: list[str], weights: dict, adaptable: set[str]) -> str:
    """auto: LoRA deltas when every differing tensor is the weight matrix of a module LoRA adapts by default
    (`adaptable`: the ends are LoRA-derived from a common version), else all differing weights."""
    if requested != "auto":
        return requested
    lora_like = all(weights[n].dim() == 2 and n.endswith(".weight") and n.rsplit(".", 1)[0] in adaptable
                    for n in names)
    return "lora" if names and lora_like else "full"


def evaluate_version(model, tokenizer, forget: EvaluationSet | None, retain: EvaluationSet | None) -> dict:
    """The audit's headline metrics of one model (the ensemble is evaluated like any version)."""
    value = metric_value
    if forget is None:
        utility = retain_utility(model, tokenizer, retain)
        return {"model_utility": value(utility, "model_utility"), "reason": "no forget records: utility only"}
    out = evaluate(model, tokenizer, forget, retain, None)
    return {"forget_exact_match": value(out, "forget_verbatim", "exact_match"),
            "forget_rouge_l": value(out, "forget_verbatim", "rouge_l_recall"),
            "knowledge_rouge_l": value(out, "forget_knowledge", "rouge_l_recall"),
            "forget_truth_ratio": value(out, "forget_truth_ratio"),
            "model_utility": value(out, "retain_utility", "model_utility")}
