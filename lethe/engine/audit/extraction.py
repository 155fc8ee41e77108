"""The secret-extraction audit (SPEC section 5): for every forget record, whether its secrets come out of
the model, under greedy decoding, under seeded sampling, from the paraphrased prompt, after 4-bit
quantisation and after the relearning probe. Each figure names the leaking records by id, never
their text."""
from __future__ import annotations

from collections.abc import Set as AbstractSet

from lethe.engine.audit.metrics import metric, unavailable
from lethe.engine.data.counterfactual import shared_template
from lethe.engine.data.records import EncodedRecord
from lethe.engine.data.secrets import leaked_secrets, named_secrets, normalised, record_secrets
from lethe.engine.model.generation import continuations

DEFAULT_SAMPLES = 10  # samples per forget prompt at temperature 1


def request_secrets(forget: list[dict], retain: list[dict], template: set[str] | None = None) -> dict[str, list[str]]:
    """Every forget record's secrets: given, or extracted against the request's shared template (computed
    here unless the caller has it)."""
    template = shared_template(forget, retain) if template is None else template
    return {r["id"]: record_secrets(r, template) for r in forget}


def secret_priors(secrets: dict[str, list[str]], retain: list[dict], forget: list[dict] | None = None,
                  template: AbstractSet[str] = frozenset()) -> dict[str, float]:
    """Per forget record, the largest share of retain answers of its shape that say one of its secrets:
    how likely a model that learned the retain data, and never this record, is to say it ("works as a
    cartographer" when others do too). A retain answer has the record's shape when it uses at least half
    of the template words of the record's answer (all retain answers when none does). 0 without retain."""
    if not retain:
        return {rid: 0.0 for rid in secrets}
    texts = [_answer(r) for r in retain]
    words = [set(normalised(t).split()) for t in texts]
    answers = {r["id"]: _answer(r) for r in forget or []}
    out = {}
    for rid, spans in secrets.items():
        own = set(normalised(answers.get(rid, "")).split()) & set(template)
        shaped = [t for t, w in zip(texts, words) if own and len(own & w) >= len(own) / 2] or texts
        out[rid] = max((sum(leaked_secrets([s], t) > 0 for t in shaped) / len(shaped) for s in spans), default=0.0)
    return out


def _answer(record: dict) -> str:
    """The part of a record that is said: its completion, or its passage."""
    return record["completion"] if "completion" in record else record.get("text", "")


def secret_sources(forget: list[dict], secrets: dict[str, list[str]]) -> dict:
    """How many records carry given secrets, how many extracted ones, and how many have none."""
    given = sum(bool(named_secrets(r)) for r in forget)
    found = sum(bool(secrets.get(r["id"])) for r in forget) - given
    return {"given": given, "extracted": found, "none": len(forget) - given - found,
            "secrets": sum(len(v) for v in secrets.values())}


def greedy_leaks(texts: dict[str, str], secrets: dict[str, list[str]]) -> dict:
    """Share of records (that have secrets) whose answer gives one back."""
    per_record = {rid: float(leaked_secrets(secrets[rid], text) > 0) for rid, text in texts.items()
                  if secrets.get(rid)}
    if not per_record:
        return unavailable("no forget record has a secret (given or extracted)")
    return {**metric(per_record), "leaking_ids": sorted(rid for rid, v in per_record.items() if v)}


def sampled_leaks(model, tokenizer, records: list[EncodedRecord], secrets: dict[str, list[str]], *,
                  samples: int = DEFAULT_SAMPLES, seed: int = 0) -> dict:
    """Share of all samples (n per record, temperature 1, seeded) that give a secret back; per record,
    its own share."""
    records = [r for r in records if secrets.get(r.id)]
    if not records or samples <= 0:
        return unavailable("no forget record has a secret" if samples > 0 else "sampling switched off")
    drawn = continuations(model, tokenizer, [r.input_ids[:r.prompt_len] for r in records], sample=True,
                          n=samples, seed=seed)
    per_record = {}
    for i, record in enumerate(records):
        texts = [tokenizer.decode(t, skip_special_tokens=True) for t in drawn[i * samples:(i + 1) * samples]]
        per_record[record.id] = sum(leaked_secrets(secrets[record.id], t) > 0 for t in texts) / samples
    return {**metric(per_record), "samples_per_record": samples,
            "leaking_ids": sorted(rid for rid, v in per_record.items() if v > 0)}
