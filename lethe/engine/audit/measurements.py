"""The audit's measurements of one model on a deletion request's records (SPEC section 5).
`evaluate` returns every metric in the one shape; `compare` puts a base and a new version side by side."""
from __future__ import annotations

import math

from lethe.engine.audit.extraction import greedy_leaks, sampled_leaks
from lethe.engine.audit.metrics import harmonic_mean, metric, unavailable
from lethe.engine.audit.metrics.degeneration import degeneration
from lethe.engine.audit.metrics.forward import token_stats
from lethe.engine.audit.metrics.privacy import attack_scores, roc_auc
from lethe.engine.audit.metrics.text import generation_metrics
from lethe.engine.audit.metrics.truth_ratio import forget_score, retain_score, truth_ratio
from lethe.engine.data.records import EncodedRecord, encode_records

ATTACKS = ("loss", "zlib", "min_k", "min_k_pp")


class EvaluationSet:
    """A set's encoded records and their variants (paraphrased prompt, truth-ratio answers)."""

    def __init__(self, records: list[dict], tokenizer, max_length: int, seed: int, what: str,
                 encoded: list[EncodedRecord] | None = None):
        """`encoded`: the records' own encodings when the caller has them (RunInputs.tokenised), one per record."""
        self.records, self.what = records, what
        encode = lambda rs: encode_records(rs, tokenizer, max_length=max_length, seed=seed, what=what)  # noqa: E731
        self.main = encoded if encoded is not None else encode(records)
        self.references = {r.id: tokenizer.decode(r.input_ids[r.prompt_len:], skip_special_tokens=True)
                           for r in self.main}
        self.paraphrased = encode([{"id": r["id"], "prompt": r["paraphrased_prompt"], "completion": r["completion"]}
                                   for r in records if r.get("paraphrased_prompt") and "completion" in r])
        tr = [r for r in records if r.get("paraphrased_completion") and r.get("perturbed_completions")]
        self.tr_ids = [r["id"] for r in tr]
        self.tr_true = encode([{"id": r["id"], "prompt": r["prompt"], "completion": r["paraphrased_completion"]}
                               for r in tr])
        self.tr_false = [encode([{"id": f"{r['id']}#{j}", "prompt": r["prompt"], "completion": p}
                                 for j, p in enumerate(r["perturbed_completions"])]) for r in tr]


def _teacher_forced(stats) -> dict:
    return {"extraction_strength": metric({s.id: s.extraction_strength for s in stats}),
            "token_accuracy": metric({s.id: s.token_accuracy for s in stats})}


def _truth_ratios(model, tokenizer, rs: EvaluationSet) -> dict[str, float]:
    if not rs.tr_ids:
        return {}
    pad = tokenizer.pad_token_id
    true = {s.id: math.log(s.probability) for s in token_stats(model, rs.tr_true, pad)}
    flat = [e for group in rs.tr_false for e in group]
    false = {s.id: math.log(s.probability) for s in token_stats(model, flat, pad)}
    return {rid: truth_ratio(true[rid], [false[e.id] for e in group])
            for rid, group in zip(rs.tr_ids, rs.tr_false)}


def verbatim(model, tokenizer, rs: EvaluationSet, stats=None) -> dict:
    """Exact match, ROUGE-L recall, extraction strength, token accuracy on a set's own prompts."""
    generated = generation_metrics(model, tokenizer, rs.main, rs.references)
    stats = stats if stats is not None else token_stats(model, rs.main, tokenizer.pad_token_id)
    return {"exact_match": generated["exact_match"], "rouge_l_recall": generated["rouge_l_recall"],
            **_teacher_forced(stats), "generated": generated["generated"], "tokens": generated["tokens"]}


def retain_utility(model, tokenizer, retain: EvaluationSet | None, generated: dict | None = None) -> dict:
    """Harmonic mean of P, ROUGE-L recall and the truth-ratio score on the retain records. `generated`:
    the retain set's generation_metrics when the caller already has them."""
    if retain is None or not retain.main:
        return {"model_utility": unavailable("no retain records (request or model)")}
    stats = token_stats(model, retain.main, tokenizer.pad_token_id)
    probability = metric({s.id: s.probability for s in stats})
    generated = generated or generation_metrics(model, tokenizer, retain.main, retain.references)
    rouge = generated["rouge_l_recall"]
    parts = [probability["value"], rouge["value"]]
    retain_ratios = _truth_ratios(model, tokenizer, retain)
    tr = retain_score(retain_ratios) if retain_ratios else unavailable("no truth-ratio fields on retain records")
    if tr["value"] is not None:
        parts.append(tr["value"])
    return {"probability": probability, "rouge_l_recall": rouge, "truth_ratio": tr,
            "model_utility": {"value": harmonic_mean(parts), "per_record": {}, "components": len(parts)}}


def evaluate(model, tokenizer, forget: EvaluationSet, retain: EvaluationSet | None, holdout: EvaluationSet | None, *,
             secrets: dict[str, list[str]] | None = None, samples: int = 0, seed: int = 0) -> dict:
    """Every metric of one model. `secrets` (record id -> spans) adds the extraction audit, with `samples`
    seeded samples per forget prompt. The answers themselves are returned under "answers" for the
    caller (perplexity under the base model) and must not reach a report."""
    pad = tokenizer.pad_token_id
    forget_stats = token_stats(model, forget.main, pad)  # one pass serves verbatim and membership
    out: dict = {"forget_verbatim": verbatim(model, tokenizer, forget, forget_stats)}
    answers = {"forget": (forget.main, out["forget_verbatim"])}
    # Knowledge: the same on paraphrased prompts, and the truth ratio.
    if forget.paraphrased:
        refs = {r.id: forget.references[r.id] for r in forget.paraphrased}
        generated = generation_metrics(model, tokenizer, forget.paraphrased, refs)
        answers["paraphrased"] = (forget.paraphrased, generated)
        out["forget_knowledge"] = {"exact_match": generated["exact_match"],
                                   "rouge_l_recall": generated["rouge_l_recall"],
                                   **_teacher_forced(token_stats(model, forget.paraphrased, pad))}
    else:
        out["forget_knowledge"] = {"rouge_l_recall": unavailable("no record carries paraphrased_prompt")}
    ratios = _truth_ratios(model, tokenizer, forget)
    out["forget_truth_ratio"] = forget_score(ratios) if ratios else \
        unavailable("no record carries paraphrased_completion and perturbed_completions")
    out["forget_truth_ratio_raw"] = ratios
    retain_generated = generation_metrics(model, tokenizer, retain.main, retain.references) \
        if retain is not None and retain.main else None
    if retain is not None and retain_generated is not None:
        answers["retain"] = (retain.main, retain_generated)
    out["retain_utility"] = retain_utility(model, tokenizer, retain, retain_generated)
    if secrets is not None:
        para = answers.get("paraphrased")
        out["forget_secrets"] = {
            "greedy": greedy_leaks(out["forget_verbatim"]["generated"], secrets),
            "paraphrased": greedy_leaks(para[1]["generated"], secrets) if para
            else unavailable("no record carries paraphrased_prompt"),
            "sampled": sampled_leaks(model, tokenizer, forget.main, secrets, samples=samples, seed=seed)}
    out["degeneration"] = {name: degeneration(generated["generated"]) for name, (_, generated) in answers.items()}
    out["answers"] = {name: {"prompts": {r.id: r.input_ids[:r.prompt_len] for r in records},
                             "tokens": generated["tokens"]} for name, (records, generated) in answers.items()}
    # Membership inference: forget (members) against holdout (non-members).
    if holdout is not None and holdout.main:
        def scores(rs, stats):
            return {s.id: attack_scores(s, rs.references[s.id]) for s in stats}
        members, others = scores(forget, forget_stats), scores(holdout, token_stats(model, holdout.main, pad))
        out["membership"] = {a: {"value": roc_auc([m[a] for m in members.values()], [o[a] for o in others.values()]),
                                 "per_record": {k: v[a] for k, v in members.items()}} for a in ATTACKS}
    else:
        out["membership"] = {a: unavailable("no holdout records in the request") for a in ATTACKS}
    return out
