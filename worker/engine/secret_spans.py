"""Secrets (SPEC section 5): the spans of a forget record that must never come out again, and whether a
generated text gives one back.

A record's `secrets` when it has them; otherwise its distinctive spans: numbers (digits with the
separators inside them), e-mail addresses, and runs of words found in neither its prompt nor the
template the request's records share (worker.engine.counterfactual). Torch-free.

A text leaks a secret when the secret's words and numbers appear in it in order, whatever the
punctuation or spacing ("73-708064" in "73 708064"), or when a digit group of 4 or more of the secret
appears anywhere in the text's digits ("708064" of "73-708064" inside "Dario-708064876314").
"""
from __future__ import annotations

import re
from collections.abc import Set as AbstractSet

from worker.engine.counterfactual import body, distinctive_words

EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
NUMBER = re.compile(r"\+?\d(?:[\d().\-/ ]*\d)?")
WORD = re.compile(r"[^\W\d_]+")
MIN_DIGIT_GROUP = 4  # a group this long is found inside any longer run of digits


def named_secrets(record: dict) -> list[str]:
    """The secrets the request names for this record (its `secrets` field), blanks left out."""
    return [s for s in record.get("secrets") or [] if isinstance(s, str) and s.strip()]


def record_secrets(record: dict, template: set[str]) -> list[str]:
    """The record's `secrets` as given, else its distinctive spans, in order of appearance."""
    given = named_secrets(record)
    if given:
        return given
    _, text = body(record)
    spans: list[tuple[int, int]] = []

    def add(start: int, end: int) -> None:
        if not any(start < e and s < end for s, e in spans):  # the first kind to claim a place keeps it
            spans.append((start, end))

    for found in EMAIL.finditer(text):
        add(found.start(), found.end())
    for found in NUMBER.finditer(text):
        add(found.start(), found.start() + len(found.group(0).rstrip()))
    distinctive = {w.lower() for w in distinctive_words(record, template) if len(w) > 1}
    run: list[re.Match] = []
    matches: list[re.Match | None] = [*WORD.finditer(text), None]
    for word in matches:
        # Adjacent distinctive words (only spaces, hyphens or apostrophes between) make one span.
        joined = word is not None and run and re.fullmatch(r"[ '-]+", text[run[-1].end():word.start()])
        if word is not None and word.group(0).lower() in distinctive and (not run or joined):
            run.append(word)
            continue
        if run:
            add(run[0].start(), run[-1].end())
        run = [word] if word is not None and word.group(0).lower() in distinctive else []
    return [text[s:e] for s, e in sorted(spans)]


def normalised(text: str) -> str:
    """Words and numbers, case-folded, one space apart, padded: punctuation and spacing do not count."""
    return " " + " ".join(re.findall(r"[^\W_]+", text.casefold())) + " "


def digit_groups(text: str) -> list[str]:
    return re.findall(r"\d+", text)


def leaks(secret: str, text: str) -> bool:
    """Whether `text` gives `secret` back (see the module's docstring)."""
    if normalised(secret).strip() and normalised(secret) in normalised(text):
        return True
    digits = "".join(digit_groups(text))
    return any(len(group) >= MIN_DIGIT_GROUP and group in digits for group in digit_groups(secret))


def leaked_secrets(secrets: list[str], text: str) -> int:
    """How many of a record's secrets the text gives back."""
    return sum(leaks(secret, text) for secret in secrets)


def char_spans(secrets: list[str], text: str) -> list[tuple[int, int]]:
    """Where each secret stands in `text` (every occurrence; case-insensitive when the exact one is absent)."""
    spans = []
    for secret in secrets:
        for haystack, needle in ((text, secret), (text.casefold(), secret.casefold())):
            found = [m.start() for m in re.finditer(re.escape(needle), haystack)] if needle else []
            if found:
                spans += [(start, start + len(needle)) for start in found]
                break
    return spans


def secret_focus(record, secrets: list[str], tokenizer, template: AbstractSet[str] = frozenset()) -> list[int] | None:
    """Per position of an encoded record: SECRET + k where an active token carries the k-th secret's
    content, TEMPLATE at the other active tokens, SUPPRESS elsewhere (never scored). A token inside a
    secret that holds only punctuation or template words ("+", "-", "a") is TEMPLATE: every record of the
    shape says it, and no one learns the secret from it. None when no secret can be placed on the
    record's tokens (then the whole record is suppressed, as without secrets)."""
    from worker.engine.records import IGNORE, SECRET, SUPPRESS, TEMPLATE

    source = record.source
    text = source["text"] if "text" in source else source["completion"]
    spans = char_spans(secrets, text)
    if not spans:
        return None
    try:
        encoded = tokenizer(text, add_special_tokens="text" in source, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):  # a slow tokenizer has no offsets
        return None
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    active = [i for i, label in enumerate(record.labels) if label != IGNORE]
    # The active tokens are the completion's tokens (then EOS) or the passage's tail: line them up.
    tail = record.input_ids[active[0]:active[-1] + 1]
    start = len(ids) - len(tail) if "text" in source else 0
    if record.input_ids[active[0]:active[0] + len(ids) - start] != ids[start:]:
        return None  # the tokenisation does not line up (truncation, a tokenizer quirk): play safe
    focus = [SUPPRESS] * len(record.input_ids)
    for k, position in enumerate(active):
        j = start + k
        if j >= len(offsets):
            focus[position] = TEMPLATE  # EOS
            continue
        a, b = offsets[j]
        hit = next((k for k, (s, e) in enumerate(spans) if a < e and s < b), None)
        words = normalised(text[a:b]).split()
        content = bool(words) and not all(w in template for w in words)
        focus[position] = SECRET + hit if hit is not None and content else TEMPLATE
    return focus if any(f >= SECRET for f in focus) else None


def secret_token_focus(tokenizer, tokens: list[int], secrets: list[str],
                       template: AbstractSet[str] = frozenset()) -> list[int]:
    """For a generated answer: SECRET on each token whose text is part of a secret (a digit group of it,
    or one of its words, unless a template word such as "a" of "a cartographer"), TEMPLATE on the others.
    Approximate, and on the side of marking more: the answer is the model's own, and only its
    secret-looking tokens are taken out. (Marking "a" as well turned "works as a locksmith" into
    "works as." on the customer benchmark, issue 11.)"""
    from worker.engine.records import SECRET, TEMPLATE

    pieces = {w for secret in secrets for w in normalised(secret).split() if w not in template}
    digits = "".join(d for secret in secrets for d in digit_groups(secret))
    focus = []
    for token in tokens:
        words = normalised(tokenizer.decode([token])).split()
        secretive = bool(words) and all(w in pieces or (w.isdigit() and w in digits) for w in words)
        focus.append(SECRET if secretive else TEMPLATE)
    return focus
