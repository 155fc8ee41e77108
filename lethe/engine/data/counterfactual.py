"""Text of the same shape that the model never saw: a record's completion with its distinctive content
(numbers, and words found in neither its prompt nor the text its neighbours share) replaced. The stop
rule's target comes from the original model's behaviour on such text (lethe.engine.methods.masc.calibration).

Torch-free and seeded: the same request gives the same counterfactuals.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from functools import partial

from lethe.engine.data.function_words import FUNCTION_WORDS

WORD = re.compile(r"[^\W\d_]+|\d")
PER_RECORD = 3  # counterfactuals per record, like TOFU's perturbed answers


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text) if not w.isdigit()]


def common_words(texts: list[str], min_share: float = 0.0, min_count: int = 2) -> set[str]:
    """Words that recur across texts (the template): in at least `min_count` texts and `min_share` of them."""
    counts = Counter(w for text in texts for w in set(words(text)))
    needed = max(min_count, min_share * len(texts))
    return {w for w, n in counts.items() if n >= needed}


def body(record: dict) -> tuple[str, str]:
    """(context, the part to perturb): prompt and completion, or a passage (all of it: the split is in tokens)."""
    if "text" in record:
        return "", record["text"]
    return record["prompt"], record["completion"]


def distinctive_words(record: dict, template: set[str]) -> list[str]:
    """Words of the completion that appear in neither its prompt nor the shared template."""
    context, text = body(record)
    known = set(words(context)) | template
    return list(dict.fromkeys(w for w in WORD.findall(text) if not w.isdigit() and w.lower() not in known))


def shared_template(forget: list[dict], retain: list[dict]) -> set[str]:
    """What the records share: words recurring across the retain texts, else across half the forget texts, and the
    function words of English (lethe.engine.data.function_words), which every text shares."""
    if len(retain) >= 4:
        return common_words([body(r)[1] for r in retain], min_share=0.05, min_count=2) | FUNCTION_WORDS
    return common_words([body(r)[1] for r in forget], min_share=0.5) | FUNCTION_WORDS


def counterfactuals(record: dict, pool: list[str], template: set[str], rng: random.Random,
                    n: int = PER_RECORD) -> list[str]:
    """Up to n versions of the completion (or passage) with every digit redrawn and every distinctive word
    swapped for one from `pool` (other records' distinctive words). Empty when nothing is distinctive."""
    _, text = body(record)
    own = distinctive_words(record, template)
    candidates = [w for w in pool if w.lower() not in {o.lower() for o in own}]
    if not own and not any(c.isdigit() for c in text):
        return []
    out: list[str] = []
    for _ in range(n * 4):  # a few tries to find n distinct versions
        swap = {w: _same_case(rng.choice(candidates), w) for w in own} if candidates else {}
        version = WORD.sub(partial(_substitute, swap=swap, rng=rng), text)
        if version != text and version not in out:
            out.append(version)
        if len(out) == n:
            break
    return out


def request_counterfactuals(forget: list[dict], retain: list[dict], seed: int) -> dict[str, list[str]]:
    """Counterfactual completions for every forget record: its own `perturbed_completions` when given,
    else generated ones; records with nothing distinctive get none."""
    template = shared_template(forget, retain)
    distinct = {r["id"]: distinctive_words(r, template) for r in forget}
    out = {}
    for record in forget:
        given = [t for t in record.get("perturbed_completions") or [] if isinstance(t, str) and t]
        if given and "text" not in record:
            out[record["id"]] = given
            continue
        pool = [w for rid, ws in distinct.items() if rid != record["id"] for w in ws]
        if not pool:  # one record, or records with nothing distinctive: the retain texts' words
            pool = sorted({w for r in retain for w in WORD.findall(body(r)[1]) if not w.isdigit()} - template)
        rng = random.Random(f"{seed}:{record['id']}")
        out[record["id"]] = counterfactuals(record, pool, template, rng)
    return out


def _substitute(match: re.Match[str], swap: dict[str, str], rng: random.Random) -> str:
    return _replace(match.group(0), swap, rng)


def _replace(token: str, swap: dict[str, str], rng: random.Random) -> str:
    if token.isdigit():
        return rng.choice([d for d in "0123456789" if d != token])
    return swap.get(token, token)


def _same_case(word: str, like: str) -> str:
    return word.capitalize() if like[:1].isupper() else word.lower()
