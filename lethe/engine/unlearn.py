"""One unlearning run, any method: resolve the parameters, prepare the model and the records, let the method's stop
policy measure theta_0, train in the one loop until the policy stops, measure, merge, report.

    outcome = run_unlearning("path/or/hub-id", forget, retain, params=params_for("masc"))
    outcome = unlearn("path/or/hub-id", RunInputs.of(forget, retain), params=params_for("masc"))

`params` come checked (params_for, MascParams.from_dict, or a stored job specification): they are not checked
again here."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.parameters import SharedParams
from lethe.engine.data.documents import document_summary
from lethe.engine.data.inputs import RunInputs
from lethe.engine.methods import Method, get_method
from lethe.engine.methods.baseline_params import BaselineParams
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.stop_policy import MascStopPolicy
from lethe.engine.model.loading import lora_modules
from lethe.engine.training.budget import FixedBudget
from lethe.engine.training.loop import train
from lethe.engine.training.result import Timing, UnlearnOutcome, UnlearnResult
from lethe.engine.training.runtime import library_versions
from lethe.engine.training.setup import ENGINE_VERSION, Prepared, build_trainable_model, prepare
from lethe.engine.training.whitening import whiten_updates


def stop_policy(method: Method, run: Prepared, params: SharedParams) -> MascStopPolicy | FixedBudget:
    """The method's stop policy, given the parameters it reads."""
    if method.stop == "online-rule" and isinstance(params, MascParams):
        return MascStopPolicy(run, params)
    if method.stop == "fixed-budget" and isinstance(params, BaselineParams):
        return FixedBudget(run, params)
    raise EngineInputError(f"{type(params).__name__} cannot drive the {method.stop} of method {method.name}",
                           field="method")


def run_unlearning(model_source: str, forget: list[dict], retain: list[dict] | None = None, *,
                   holdout: list[dict] | None = None, format: str = "plain", **options: Any) -> UnlearnOutcome:
    """From JSON records (the CLI, tests, benchmarks): checked and normalised once, then `unlearn`. `format`:
    "plain" (prompt + completion as one string) or "chat" (the tokenizer's chat template)."""
    return unlearn(model_source, RunInputs.of(forget, retain, holdout, format), **options)


def unlearn(model_source: str, inputs: RunInputs, *, params: SharedParams | None = None, device: str | None = None,
            progress: Callable[[dict], None] | None = None, should_cancel: Callable[[], bool] | None = None,
            memory_limit: int | None = None, anchor: str | None = None) -> UnlearnOutcome:
    """The run on records already checked (`RunInputs`, which the audit and connectivity read too).
    `memory_limit`: bytes the run may plan to use (None: what the device holds); over it, DoesNotFit at once.
    `anchor`: a model (a version of the same lineage) whose predictions on the retain records the retain term keeps,
    in place of the start model's (issue 28: over sequential requests the start has drifted; the anchor has not)."""
    params = (params or get_method("masc").parse()).resolved()  # every "auto" the parameters decide, once
    method = get_method(params.method)
    objective_class = method.objective_class()
    run = prepare(model_source, inputs, params, device, memory_limit=memory_limit, objective=objective_class,
                  anchor=anchor)
    params = run.params  # lora decided ("auto": whitened full fine-tuning where it fits, else LoRA)
    stop = stop_policy(method, run, params)
    trainable = build_trainable_model(run.model, params, objective_class, run.precision)
    trainable.anchor = run.anchor
    if params.whiten_updates:
        whiten_updates(trainable, lora_modules(trainable.model, params.lora_targets), run.retain,
                       run.tokenizer.pad_token_id, params.whiten_damping, params.eval_batch_size,
                       guard=params.guard_erasures, guard_share=params.guard_share)
    objective = objective_class(params, trainable, run.tokenizer.pad_token_id)
    stop.start(objective)
    trained = train(objective, stop, trainable.trainable_parameters(), lr=params.lr,
                    weight_decay=params.weight_decay, grad_clip=params.grad_clip,
                    precision=run.precision, started=run.started, should_cancel=should_cancel, progress=progress)
    measured = stop.finish(trained.stop_reason)
    if progress is not None and trained.stop_reason != "cancelled":
        # One more report, so that the last V a client sees is the one measured at the stop.
        last = trained.loss_trace[-1] if trained.loss_trace else {}
        progress({"step": trained.steps, "max_steps": stop.max_steps,
                  "losses": {k: v for k, v in last.items() if k not in ("step", "forget_rows")},
                  "violation_rate": measured.final_violation_rate, "alpha": stop.alpha,
                  "elapsed": time.perf_counter() - run.started})
    # The rule checked a merged copy before it let the run stop: that copy is what is saved.
    served = getattr(stop, "served", None) if trained.stop_reason == "alpha" else None
    merged = served if served is not None else trainable.merged(run.saved_dtype) if trained.stop_reason != "cancelled" \
        else None
    timing = Timing(wall_seconds=time.perf_counter() - run.started, load_seconds=trained.loop_started - run.started,
                    loop_seconds=trained.loop_seconds, stop_check_seconds=stop.stop_check_seconds,
                    calibration_seconds=stop.calibration_seconds)
    result = UnlearnResult(
        engine_version=ENGINE_VERSION, method=method.name, model=str(model_source), device=str(run.device),
        stop_reason=trained.stop_reason, steps=trained.steps, measured=measured, loss_trace=trained.loss_trace,
        seed=params.seed, params=params.as_dict(), versions=library_versions(),
        truncated=[{"id": r.id, "dropped_prompt_tokens": r.truncated_tokens}
                   for r in run.forget + run.retain if r.truncated_tokens],
        timing=timing, peak_memory={**run.memory.read(), "estimate_bytes": run.memory_plan.peak_bytes,
                                    "estimate": run.memory_plan.parts}, format=inputs.format,
        precision={**run.precision.describe(), "gradient_checkpointing": params.gradient_checkpointing,
                   "checkpoint_dtype": str(run.saved_dtype).removeprefix("torch.")},
        documents=document_summary([r.source for r in run.forget], measured.per_record),
        anchor=str(anchor) if run.anchor is not None else None)
    return UnlearnOutcome(result=result, model=merged, tokenizer=run.tokenizer)
