"""Whether a word of another record, said in an answer, tells anything about the answer's subject.

A coalesced run (or any request of several records) holds each answer to the content of every record of its request:
asked about one record, the model must not give another's back either. A number or a phrase of several words gives
its record back whoever the answer is about. A single word does not: "fears", said in an answer about an author, is
that author's only if the model says it because of whom it is asked about. The test is the memorisation gain that
decided the record's content in the first place (lethe.engine.methods.masc.memorisation), on the current model:

    gain(w) = log p(w | prompt, answer before w) - mean_j log p(w | prompt_j, answer before w),

prompt_j the same question about someone else (the record's counterfactual prompts). A word the model says about
anyone (gain < min_gain) is its vocabulary, not the subject's fact; a model that never saw the records says such
words of a pretrained vocabulary all the time. Measured on mini-TOFU, three requests in one run: 56 of the 61 records
that failed a confirmation by a leak said only another record's words ("fears", "authentic", "delve").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from lethe.engine.data.secrets import normalised
from lethe.engine.model.generation import answer_logprobs


def single_word(span: str) -> bool:
    """A span of one word and no digits: one that tells something only about whom it is said of."""
    return not re.search(r"\d", span) and len(normalised(span).split()) == 1


def overlapping_tokens(ends: list[int], regions: list[tuple[int, int]]) -> list[int]:
    """The answer tokens (each ending at ends[k] in the decoded text) whose characters overlap one of the regions."""
    return [k for k in range(len(ends)) if any(s < ends[k] and (ends[k - 1] if k else 0) < e for s, e in regions)]


@dataclass
class TieQuestion:
    """One answer's single words of other records: the prompt it answered, the same prompt about others, the answer's
    tokens, and per word the answer tokens that say it."""
    prompt: list[int]
    others: list[list[int]]
    tokens: list[int]
    words: list[list[int]]


def subject_gains(model, pad_id: int, questions: list[TieQuestion]) -> list[list[float]]:
    """Per question, each word's gain (nats, summed over its tokens) on `model`."""
    prompts, answers = [], []
    for q in questions:
        prompts += [q.prompt, *q.others]
        answers += [q.tokens] * (1 + len(q.others))
    logprobs = iter(answer_logprobs(model, pad_id, prompts, answers))
    out = []
    for q in questions:
        mine = next(logprobs)
        theirs = [next(logprobs) for _ in q.others]
        out.append([float(mine[w].sum() - sum(t[w].sum() for t in theirs) / len(theirs)) for w in q.words])
    return out


def tied(model, pad_id: int, questions: list[TieQuestion], min_gain: float) -> list[bool]:
    """Per question: whether one of its words is tied to the answer's subject (gain >= min_gain). A question that
    cannot show every word untied (no prompt about someone else, a word on no token) counts as tied."""
    measurable = [bool(q.others and q.words and all(q.words)) for q in questions]
    gains = iter(subject_gains(model, pad_id, [q for q, ok in zip(questions, measurable) if ok]))
    return [any(g >= min_gain for g in next(gains)) if ok else True for ok in measurable]
