"""Generation-based verbatim metrics: greedy exact match and ROUGE-L recall (rouge_score, stemmer on)."""
from __future__ import annotations

from functools import lru_cache

from rouge_score import rouge_scorer

from lethe.engine.audit.metrics import metric
from lethe.engine.data.records import EncodedRecord
from lethe.engine.model.generation import greedy_continuations


@lru_cache
def _scorer():
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l_recall(reference: str, generated: str) -> float:
    """LCS(reference, generated) / |reference| over rouge_score's tokens."""
    return _scorer().score(reference, generated)["rougeL"].recall


def generation_metrics(model, tokenizer, records: list[EncodedRecord], references: dict[str, str],
                       batch_size: int = 16) -> dict:
    """Greedy exact match (the active tokens, EOS included) and ROUGE-L recall against `references`; the
    generated text and tokens come along for the metrics that read them (secrets, degeneration)."""
    generated = greedy_continuations(model, tokenizer, records, batch_size=batch_size)
    exact, rouge, texts, tokens_by_id = {}, {}, {}, {}
    for record, tokens in zip(records, generated):
        target = record.input_ids[record.prompt_len:]
        exact[record.id] = float(tokens[:len(target)] == target)
        texts[record.id] = tokenizer.decode(tokens, skip_special_tokens=True)
        tokens_by_id[record.id] = tokens
        rouge[record.id] = rouge_l_recall(references[record.id], texts[record.id])
    return {"exact_match": metric(exact), "rouge_l_recall": metric(rouge), "generated": texts,
            "tokens": tokens_by_id}
