"""What `make bench-forgetting` measures of one model (issue 24): erasure, the extraction audit's channels, the
degeneration of answers, fluency and membership as a retrained model would score them, and what is kept.

Fluency is the perplexity of the greedy answers to erased prompts under the retrain reference (a model that never
saw the erased records): under the base it is meaningless, since the base memorised other answers (the reference's
own answers score 1838 there). PrivLeak compares membership AUCs (forget records against never-trained holdout
records) with the reference's: (AUC_model - AUC_ref) / AUC_ref * 100 on MUSE's AUC, so a model that still memorises
scores near -100, a retrain-like one 0, one unlearned past a retrain positive."""
from __future__ import annotations

from lethe.engine.audit.extraction import greedy_leaks, sampled_leaks
from lethe.engine.audit.measurements import ATTACKS, EvaluationSet, retain_utility
from lethe.engine.audit.metrics.degeneration import answer_perplexity, degeneration
from lethe.engine.audit.metrics.forward import token_stats
from lethe.engine.audit.metrics.privacy import attack_scores, muse_auc, privleak, roc_auc
from lethe.engine.audit.metrics.stats import ks_p_value
from lethe.engine.audit.metrics.text import generation_metrics
from lethe.engine.audit.quantize import quantized_copy
from lethe.engine.audit.relearn import relearning_probe
from lethe.engine.audit.verdict import CHANNELS, decide, leak_rates, sampled_floor, table, union
from lethe.engine.model.generation import exact_match, greedy_continuations

SAMPLES = 10  # seeded samples per forget prompt
PRIVLEAK_ATTACKS = ("loss", "zlib", "min_k_pp")


def judged(channels: dict, reference_channels: dict | None, base_channels: dict | None, rule: dict | None,
           priors: dict[str, float] | None = None) -> dict:
    """The per-record verdict on a run (lethe.engine.audit.verdict, as the service's report judges it): the channels'
    leak rates and "Forgotten" or not. Floors: the retrain reference's own figures, the base's loops, and for samples
    also `priors` (lethe.engine.audit.extraction.secret_priors, as the service's audit computes them)."""
    ref = reference_channels or {}
    figures = {c: {"per_record": channels.get(c), "floor": ref.get(c)} for c in CHANNELS if c != "rule"}
    figures["sampled"].update(samples=SAMPLES, floor=sampled_floor(ref.get("sampled"), priors))
    figures["loops"]["floor"] = union(ref.get("loops"), (base_channels or {}).get("loops"))
    for c in ("quantized", "relearned"):  # greedy channels: a record the reference says too is within its floor
        figures[c]["floor"] = ref.get("greedy")
    figures["rule"] = {"per_record": rule}
    ids = sorted(channels.get("greedy") or {})
    decided = decide(table(figures, ids))
    return {"rates": leak_rates(decided), "blocking": [c for c, x in decided.items() if x["blocks"]]}


def text_of(tokenizer, encoded, model) -> dict[str, str]:
    return {r.id: tokenizer.decode(t, skip_special_tokens=True)
            for r, t in zip(encoded, greedy_continuations(model, tokenizer, encoded))}


def membership_aucs(model, tokenizer, forget: EvaluationSet, holdout: EvaluationSet) -> dict[str, float]:
    """MUSE's AUC per attack: forget records (members) against holdout records (never trained on)."""
    pad = tokenizer.pad_token_id

    def scores(rs: EvaluationSet) -> list[dict[str, float]]:
        return [attack_scores(s, rs.references[s.id]) for s in token_stats(model, rs.main, pad)]

    members, others = scores(forget), scores(holdout)
    return {a: muse_auc(roc_auc([m[a] for m in members], [o[a] for o in others])) for a in ATTACKS}


def measure(model, tokenizer, sets: dict, neighbour_ids: set[str], reference=None, reference_figures=None) -> dict:
    """Every column of a row. `sets`: forget, retain, utility (optional), holdout (optional) EvaluationSets and the
    audit's secrets; `reference`: the retrain reference's model, `reference_figures` its own measure() (for
    PrivLeak and forget quality)."""
    retain_em = exact_match(model, tokenizer, sets["retain"].main)["per_record"]
    near = [v for k, v in retain_em.items() if k in neighbour_ids]
    far = [v for k, v in retain_em.items() if k not in neighbour_ids]
    forget, secrets = sets["forget"], sets["secrets"]
    answered = generation_metrics(model, tokenizer, forget.main, forget.references)  # one greedy pass serves all
    forget_texts = answered["generated"]
    # The paraphrased answers, and whether they reproduce the record (the verdict's paraphrase channel reads both).
    para = generation_metrics(model, tokenizer, forget.paraphrased, {r.id: forget.references[r.id]
                                                                     for r in forget.paraphrased}) \
        if forget.paraphrased else None
    para_texts = para["generated"] if para else {}
    loops = degeneration({**forget_texts, **{f"{k}#p": v for k, v in para_texts.items()}})
    greedy_leaked = greedy_leaks(forget_texts, secrets)
    sampled = sampled_leaks(model, tokenizer, forget.main, secrets, samples=SAMPLES, seed=0)
    para_leaked = greedy_leaks(para_texts, secrets) if para_texts else None
    out = {"forget_exact_match": answered["exact_match"]["value"],
           "retain_exact_match": sum(retain_em.values()) / len(retain_em),
           "neighbour_exact_match": sum(near) / len(near) if near else None,
           "other_exact_match": sum(far) / len(far) if far else None,
           "model_utility": retain_utility(model, tokenizer,
                                           sets.get("utility", sets["retain"]))["model_utility"]["value"],
           "secret_greedy": greedy_leaked["value"], "secret_sampled": sampled["value"],
           "secret_paraphrased": para_leaked["value"] if para_leaked else None,
           "forget_loops": loops["loop_share"]["value"],  # answers to the prompts and the paraphrased prompts
           "forget_distinct_2": loops["distinct_2"]["value"],
           "retain_loops": degeneration(text_of(tokenizer, sets["retain"].main, model))["loop_share"]["value"]}
    if reference is not None:  # fluency as a model that never saw the records scores it
        prompts = {r.id: r.input_ids[:r.prompt_len] for r in forget.main}
        out["forget_ppl_under_reference"] = answer_perplexity(reference, prompts, answered["tokens"],
                                                              tokenizer.pad_token_id)["value"]
    if sets.get("holdout") is not None:
        out["membership_auc"] = membership_aucs(model, tokenizer, forget, sets["holdout"])
        if reference_figures is not None and "membership_auc" in reference_figures:
            for attack in PRIVLEAK_ATTACKS:
                out[f"privleak_{attack}"] = privleak(out["membership_auc"][attack],
                                                     reference_figures["membership_auc"][attack])
    if forget.tr_ids:
        from lethe.engine.audit.measurements import _truth_ratios  # the audit's own per-record truth ratios

        out["forget_truth_ratios"] = _truth_ratios(model, tokenizer, forget)
        if reference_figures is not None and reference_figures.get("forget_truth_ratios"):
            out["forget_quality"] = ks_p_value(list(out["forget_truth_ratios"].values()),
                                               list(reference_figures["forget_truth_ratios"].values()))
    quantized, _ = quantized_copy(model)
    q = generation_metrics(quantized, tokenizer, forget.main, forget.references)
    quantized_leaked = greedy_leaks(q["generated"], secrets)
    out["secret_quantised"] = quantized_leaked["value"]
    del quantized
    probe = relearning_probe(model, tokenizer, forget.main, forget.references, seed=0, secrets=secrets)
    out["secret_relearned"] = probe["points"][-1]["secret_leak"] if probe.get("points") else None
    # Per record, what the verdict reads (lethe.engine.audit.verdict): ids and figures only.
    loop_of = loops["loop_share"]["per_record"]
    out["channels"] = {
        "greedy": union(answered["exact_match"]["per_record"], greedy_leaked.get("per_record")),
        "paraphrase": union(para["exact_match"]["per_record"], (para_leaked or {}).get("per_record")) if para
        else None,
        "sampled": sampled.get("per_record") or None,
        "quantized": union(q["exact_match"]["per_record"], quantized_leaked.get("per_record")),
        "relearned": probe.get("per_record") or None,
        "loops": {r.id: max(loop_of.get(r.id, 0.0), loop_of.get(f"{r.id}#p", 0.0)) for r in forget.main}}
    out["examples"] = {rid: forget_texts[rid][:120] for rid in list(forget_texts)[:4]}  # to look at, not to score
    return out
