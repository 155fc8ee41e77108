"""Secrets (SPEC section 5): the spans of a forget record that must never come out again, and whether a
generated text gives one back.

A record's `secrets` when it has them; otherwise its distinctive spans: numbers (digits with the
separators inside them) its prompt does not state, e-mail addresses, and runs of words found in neither its
prompt nor the template the request's records share (lethe.engine.data.counterfactual). Torch-free.

A text leaks a secret when the secret's words and numbers appear in it in order, whatever the
punctuation or spacing ("73-708064" in "73 708064"), when a digit group of 4 or more of the secret
appears anywhere in the text's digits ("708064" of "73-708064" inside "Dario-708064876314"), or when a number of
the text says, from the start of one of its digit groups, the first 5 digits of one of the secret's numbers
("+49 917." of "+49 917 7457569": its country and area code). Where such a head is common (a city's dialling
code), the kept records' share of it is what the rule's and the verdict's floors allow.
"""
from __future__ import annotations

import re

from lethe.engine.data.counterfactual import body, distinctive_words

EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
NUMBER = re.compile(r"\+?\d(?:[\d().\-/ ]*\d)?")
WORD = re.compile(r"[^\W\d_]+")
MIN_DIGIT_GROUP = 4  # a group this long is found inside any longer run of digits
NUMBER_HEAD = 5  # a number's first digits, this many: said from a group's start, they give the number away


def named_secrets(record: dict) -> list[str]:
    """The secrets the request names for this record (its `secrets` field), blanks left out."""
    return [s for s in record.get("secrets") or [] if isinstance(s, str) and s.strip()]


def record_secrets(record: dict, template: set[str]) -> list[str]:
    """The record's `secrets` as given, else its distinctive spans, in order of appearance."""
    given = named_secrets(record)
    if given:
        return given
    context, text = body(record)
    # A number the prompt states is read from the prompt, by any model: not the record's to give back.
    stated = {re.sub(r"\D", "", found.group(0)) for found in NUMBER.finditer(context)}
    spans: list[tuple[int, int]] = []

    def add(start: int, end: int) -> None:
        if not any(start < e and s < end for s, e in spans):  # the first kind to claim a place keeps it
            spans.append((start, end))

    for found in EMAIL.finditer(text):
        add(found.start(), found.end())
    for found in NUMBER.finditer(text):
        if re.sub(r"\D", "", found.group(0)) not in stated:
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
    return digits_leak(secret, text)


def long_digit_groups(text: str) -> list[str]:
    """The runs of MIN_DIGIT_GROUP or more digits in `text`: what a leak of a number is judged by."""
    return [group for group in digit_groups(text) if len(group) >= MIN_DIGIT_GROUP]


def digits_leak(secret: str, text: str) -> bool:
    """Whether `text` gives back a group of MIN_DIGIT_GROUP or more digits of `secret` (inside its own digits), or the
    head of one of its numbers (head_regions)."""
    digits = "".join(digit_groups(text))
    return any(group in digits for group in long_digit_groups(secret)) or bool(head_regions(secret, text))


def digits_can_leak(secret: str) -> bool:
    """Whether digits_leak can ever hold for `secret`: it has a long digit group or a number's head."""
    return bool(long_digit_groups(secret) or number_heads(secret))


def number_heads(secret: str) -> set[str]:
    """The first NUMBER_HEAD digits of each number of `secret` that has more (separators left out)."""
    numbers = (re.sub(r"\D", "", found.group(0)) for found in NUMBER.finditer(secret))
    return {digits[:NUMBER_HEAD] for digits in numbers if len(digits) >= NUMBER_HEAD}


def head_regions(secret: str, text: str) -> list[tuple[int, int]]:
    """Character ranges of `text` that say the head of one of the secret's numbers: digits of one number of the
    text, separators left out, that begin with it at the start of one of its digit groups (the secret's number said
    from its start, also where the pattern joins it to a number before it: "12 49 917"). "+49 917." gives
    "+49 917 7457569" away: a model that stops after the area code still said whose number it is."""
    heads = number_heads(secret)
    if not heads:
        return []
    regions = []
    for found in NUMBER.finditer(text):
        digits = [(found.start() + i, c) for i, c in enumerate(found.group(0)) if c.isdigit()]
        string = "".join(c for _, c in digits)
        for k, (position, _) in enumerate(digits):
            group_start = k == 0 or digits[k - 1][0] != position - 1
            if group_start and any(string.startswith(head, k) for head in heads):
                regions.append((position, digits[k + NUMBER_HEAD - 1][0] + 1))
    return regions


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
