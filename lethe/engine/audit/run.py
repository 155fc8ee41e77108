"""The whole audit of one deletion request: the base and the new version measured on the same records,
forget quality and PrivLeak against a retrain reference when one is registered, quantisation and
relearning probes. Models are loaded one at a time, so the audit never holds more than two."""
from __future__ import annotations

import gc
import random
import time

import torch

from lethe.engine.audit.extraction import DEFAULT_SAMPLES, greedy_leaks, request_secrets, secret_priors, secret_sources
from lethe.engine.audit.measurements import ATTACKS, EvaluationSet, evaluate, retain_utility, verbatim
from lethe.engine.audit.metrics import unavailable
from lethe.engine.audit.metrics.degeneration import answer_perplexity
from lethe.engine.audit.metrics.privacy import muse_auc, privleak
from lethe.engine.audit.metrics.stats import ks_p_value
from lethe.engine.audit.metrics.text import generation_metrics
from lethe.engine.audit.quantize import quantized_copy
from lethe.engine.audit.relearn import relearning_probe
from lethe.engine.audit.verdict import per_record_at, union
from lethe.engine.contract.chat_format import render
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.counterfactual import shared_template
from lethe.engine.data.documents import split_documents
from lethe.engine.data.inputs import RunInputs
from lethe.engine.data.tokenised import TokenisedInputs
from lethe.engine.model.loading import context_length, load_model

# secret_samples: seeded samples per forget prompt for the extraction audit; the two maxima relax the verdict
# (lethe.engine.audit.verdict): the share of records a greedy channel may let leak, and the rate above its floor at
# which one record's samples may say its secret.
DEFAULT_OPTIONS = {"quantization": True, "relearn": True, "examples": False, "secret_samples": DEFAULT_SAMPLES,
                   "secret_greedy_max": 0.0, "secret_sampled_max": 0.0}
RETAIN_LIMIT = 100  # utility is measured on a seeded sample of at most this many retain records
UTILITY_LIMIT = 200  # the utility set is measured on a seeded sample of at most this many records
PRIOR_LIMIT = 2000  # the samples' floor (a share of retain answers) is read from a seeded sample of this many


def _sample(records: list, limit: int, seed: int) -> list:
    return random.Random(seed).sample(records, limit) if len(records) > limit else records


def _sets(tokenizer, tokens: TokenisedInputs, seed: int, max_length: int, retain: bool = True):
    """The audit's evaluation sets from the run's encodings; retain as a seeded sample of RETAIN_LIMIT records (the
    same positions of the records and of their encodings)."""
    def make(records: list[dict], encoded: list, what: str) -> EvaluationSet | None:
        return EvaluationSet(records, tokenizer, max_length, seed, what, encoded) if records else None

    sample = _sample(list(zip(tokens.retain, tokens.records("retain"))), RETAIN_LIMIT, seed) if retain else []
    return (make(tokens.forget, tokens.records("forget"), "forget"),
            make([r for r, _ in sample], [e for _, e in sample], "retain"),
            make(tokens.holdout, tokens.records("holdout"), "holdout"))


def _utility_set(tokenizer, utility: list[dict] | None, format: str, seed: int,
                 max_length: int) -> EvaluationSet | None:
    """The utility records as the run's records are shown to the model (normalised, its format, long documents as
    windows), a seeded sample of UTILITY_LIMIT; None without any."""
    if not utility:
        return None
    records = split_documents(render(normalise_records(utility, "utility"), tokenizer, format, "utility"), tokenizer,
                              max_length, "utility")
    return EvaluationSet(_sample(records, UTILITY_LIMIT, seed), tokenizer, max_length, seed, "utility")


def _utility_change(before: dict, after: dict) -> dict:
    """Model utility (harmonic mean of answer probability, ROUGE-L recall and, where the records have its fields,
    the truth ratio) on the utility set, after beside before, and each component's pair."""
    value, base_value = after["model_utility"]["value"], before["model_utility"]["value"]
    return {"value": value, "base_value": base_value, "change": value - base_value, "per_record": {},
            "components": {name: {"value": after[name]["value"], "base_value": before[name]["value"]}
                           for name in ("probability", "rouge_l_recall", "truth_ratio")
                           if after[name].get("value") is not None}}


def _strip(evaluation: dict, examples: bool) -> dict:
    """Generated text quotes the forget records: kept only when the request asked for examples; tokens
    and the answers kept for the base model's perplexity never reach a report."""
    evaluation.pop("answers", None)
    evaluation["forget_verbatim"].pop("tokens", None)
    if not examples:
        evaluation["forget_verbatim"].pop("generated", None)
    return evaluation


def _perplexity_under(model, evaluation: dict, pad_id: int) -> None:
    """Each set's answers scored by `model` (the base): fluent text scores low, loops and noise high."""
    for name, answers in evaluation.get("answers", {}).items():
        evaluation["degeneration"][name]["perplexity_under_base"] = answer_perplexity(
            model, answers["prompts"], answers["tokens"], pad_id)


def run_audit(base_source: str, new_model, tokenizer, inputs: RunInputs, *, options: dict | None = None,
              reference_source: str | None = None, seed: int = 0, device=None, max_length: int = 0,
              utility: list[dict] | None = None) -> dict:
    """The request's records as the unlearning read them (`inputs`: its format too); `max_length`: the unlearning's
    (0: the model's context), so that long documents make the same windows. `utility`: records no run trains on
    (the model's utility set, issue 28), measured on the new version and on the base: the erasure's collateral
    damage on what no retain term protects."""
    options = {**DEFAULT_OPTIONS, **(options or {})}
    started = time.perf_counter()
    context = context_length(new_model, tokenizer, max_length)

    if not inputs.forget:
        raise EngineInputError("forget: no records to audit", field="forget")
    tokens = inputs.tokenised(tokenizer, context, seed)
    forget, retain, holdout = tokens.forget, tokens.retain, tokens.holdout
    device = device or next(new_model.parameters()).device
    sets = _sets(tokenizer, tokens, seed, context)
    template = shared_template(forget, retain)
    secrets = request_secrets(forget, retain, template)
    extraction = dict(secrets=secrets, samples=options["secret_samples"], seed=seed)
    timings = {}

    t0 = time.perf_counter()
    after = evaluate(new_model, tokenizer, *sets, **extraction)
    try:
        utility_set = _utility_set(tokenizer, utility, inputs.format, seed, context)
        utility_missing = "no utility records registered for this model"
    except EngineInputError as exc:  # one record the model cannot be asked costs this figure, not the audit
        utility_set, utility_missing = None, f"the utility set could not be measured: {exc}"
    utility_after = retain_utility(new_model, tokenizer, utility_set) if utility_set else None
    timings["new_version"] = time.perf_counter() - t0
    report = {"options": options, "sets": {"forget": len(forget),
                                           "retain_measured": len(sets[1].main) if sets[1] else 0,
                                           "holdout": len(holdout)},
              "secrets": secret_sources(forget, secrets),
              # The sampled channel's floor (beside a retrain reference's own samples): how often the retain answers
              # of a record's shape say its secret (a model that learned only them says it about as often).
              "secret_priors": secret_priors(secrets, _sample(retain, PRIOR_LIMIT, seed), forget, template)}
    if options["quantization"]:
        t0 = time.perf_counter()
        quantized, scheme = quantized_copy(new_model)
        q = verbatim(quantized, tokenizer, sets[0])
        del quantized
        report["quantization"] = {"scheme": scheme,
                                  "forget_verbatim": {k: v for k, v in q.items() if k not in ("generated", "tokens")},
                                  "forget_secrets": greedy_leaks(q["generated"], secrets),
                                  "change": {k: q[k]["value"] - after["forget_verbatim"][k]["value"]
                                             for k in ("exact_match", "rouge_l_recall", "extraction_strength",
                                                       "token_accuracy")}}
        timings["quantization"] = time.perf_counter() - t0
    if options["relearn"]:
        t0 = time.perf_counter()
        try:
            report["relearning"] = relearning_probe(new_model, tokenizer, sets[0].main, sets[0].references,
                                                    seed=seed, secrets=secrets)
        except torch.OutOfMemoryError as exc:  # a float32 copy and its optimiser state: twice a bfloat16 model
            report["relearning"] = unavailable(f"the probe's float32 copy did not fit in memory ({exc})"[:500])
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        timings["relearning"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    base, _ = load_model(base_source, device)
    before = evaluate(base, tokenizer, *sets, **extraction)
    utility_before = retain_utility(base, tokenizer, utility_set) if utility_set else None
    _perplexity_under(base, after, tokenizer.pad_token_id)
    _perplexity_under(base, before, tokenizer.pad_token_id)
    if "quantization" in report:  # the 4-bit probe's "before": the base's own 4-bit copy
        quantized, _ = quantized_copy(base)
        report["quantization"]["forget_secrets_before"] = greedy_leaks(
            generation_metrics(quantized, tokenizer, sets[0].main, sets[0].references)["generated"], secrets)
        del quantized
    del base
    gc.collect()
    timings["base_version"] = time.perf_counter() - t0

    reference = None
    if reference_source:
        t0 = time.perf_counter()
        # The reference is measured through its own tokenizer (a retrain may not share the model's).
        ref_model, ref_tokenizer = load_model(reference_source, device)
        ref_context = context_length(ref_model, ref_tokenizer, max_length)
        ref_tokens = inputs.tokenised(ref_tokenizer, ref_context, seed)
        ref_forget, _, ref_holdout = _sets(ref_tokenizer, ref_tokens, seed, ref_context, retain=False)
        # With the request's secrets and samples: the floor of each verdict channel (lethe.engine.audit.verdict) is
        # what a model that never saw the records says there.
        reference = evaluate(ref_model, ref_tokenizer, ref_forget, None, ref_holdout, **extraction)
        del ref_model
        # A floor counts only for a record the reference was asked the same thing about: a window of a long
        # document cut at other places by the reference's tokenizer is another text.
        ours = {rid: " ".join(text.split()) for rid, text in sets[0].references.items()}
        same = {rid for rid, text in ref_forget.references.items() if ours.get(rid) == " ".join(text.split())}
        report["reference_figures"] = {name: {rid: v for rid, v in figure.items() if rid in same} if figure else figure
                                       for name, figure in reference_figures(reference).items()}
        timings["reference"] = time.perf_counter() - t0
    report["forget_quality"] = _forget_quality(before, after, reference)
    report["utility_set"] = {**_utility_change(utility_before, utility_after), "records": len(utility_set.main)} \
        if utility_set and utility_before is not None and utility_after is not None \
        else unavailable(utility_missing)
    report["privleak"] = _privleak(after, reference, sets[2] is not None)
    report["before"] = _strip(before, options["examples"])
    report["after"] = _strip(after, options["examples"])
    timings["total"] = time.perf_counter() - started
    report["timing_seconds"] = timings
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return report


def reference_figures(reference: dict) -> dict:
    """The retrain reference's own per-record figures on the verdict's channels (ids and numbers, no text)."""
    return {"greedy": per_record_at(reference, "forget_secrets", "greedy"),
            "exact_match": per_record_at(reference, "forget_verbatim", "exact_match"),
            "paraphrased": per_record_at(reference, "forget_secrets", "paraphrased"),
            "knowledge_exact_match": per_record_at(reference, "forget_knowledge", "exact_match"),
            "sampled": per_record_at(reference, "forget_secrets", "sampled"),
            "loops": union(per_record_at(reference, "degeneration", "forget", "loop_share"),
                           per_record_at(reference, "degeneration", "paraphrased", "loop_share"))}


def _forget_quality(before: dict, after: dict, reference: dict | None) -> dict:
    if reference is None:
        return unavailable("no retrain reference is registered for this forget set")
    ref = list(reference["forget_truth_ratio_raw"].values())
    if not ref:
        return unavailable("the forget records carry no truth-ratio fields")
    return {"value": ks_p_value(list(after["forget_truth_ratio_raw"].values()), ref), "per_record": {},
            "base_value": ks_p_value(list(before["forget_truth_ratio_raw"].values()), ref)}


def _privleak(after: dict, reference: dict | None, has_holdout: bool) -> dict:
    if not has_holdout:
        return {a: unavailable("no holdout records in the request") for a in ATTACKS}
    out: dict[str, dict] = {}
    for attack in ATTACKS:
        auc = muse_auc(after["membership"][attack]["value"])
        ref_auc = muse_auc(reference["membership"][attack]["value"]) if reference else 0.5
        out[attack] = {"value": privleak(auc, ref_auc) if ref_auc > 0 else None, "per_record": {}, "auc": auc,
                       "reference_auc": ref_auc,
                       "reference": "retrain reference" if reference else "0.5 (no retrain reference registered)"}
        if ref_auc == 0:
            out[attack]["reason"] = "the reference's AUC is 0, so PrivLeak (relative to it) is undefined"
    return out
