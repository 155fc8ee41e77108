"""A record's own content and its counterfactual (SPEC section 3, "Where the suppressed tokens go"). Torch-free.

A record's units are its words and runs of digits ("555-4584" is two, of which only the second may be the record's
own; an e-mail address is its words and digits). Its candidate atoms are the units of the said part (the completion,
or a passage) that may be its own content: not a template word, not a single letter, not something its prompt
already says (a model that never saw the record copies that from the question).

Its counterfactual is the same record about someone else: the names and numbers of its prompt replaced, and in its
said text the candidates that turn out to be its content (lethe.engine.methods.masc.memorisation decides, left to
right, and has theta_0 write the replacements). A unit is replaced the same way wherever it recurs, so an answer that
repeats the question's name repeats the new one. `Substitution.map_offset` lines the two texts up character by
character, so that each token of the record finds its counterpart.
"""
from __future__ import annotations

import random
import re
from bisect import bisect_right
from dataclasses import dataclass, field

from lethe.engine.data.counterfactual import body, common_words, shared_template, words
from lethe.engine.data.function_words import FUNCTION_WORDS
from lethe.engine.data.secrets import normalised

WORD = re.compile(r"[^\W\d_]+")
UNIT = re.compile(r"[^\W\d_]+|\d+")  # what a counterfactual replaces, and what may be content
DRAWS = 3  # counterfactuals per record: gains and targets average over them
Pieces = list[tuple[int, int, int, int]]  # replaced pieces: (true start, true end, counterfactual start, end)


@dataclass(frozen=True)
class Atom:
    start: int  # character offsets in the said text (completion or passage)
    end: int
    text: str

    @property
    def is_number(self) -> bool:
        return self.text.isdigit()

    @property
    def key(self) -> str:
        """What identifies the unit wherever it recurs: the lower-cased word, or the digits."""
        return self.text.lower()


def candidate_atoms(record: dict, template: set[str], from_char: int = 0) -> list[Atom]:
    """The units of the said text (from `from_char` on) that may be the record's own content: not a template word,
    not a single letter, not a word or number the prompt already gives."""
    context, said = body(record)
    given = set(words(context)) | set(re.findall(r"\d+", context))
    out = []
    for m in UNIT.finditer(said):
        text = m.group(0)
        if m.start() < from_char or text.lower() in given:
            continue
        if not text.isdigit() and (len(text) < 2 or text.lower() in template and not _named(text, said, m.start())):
            continue
        out.append(Atom(m.start(), m.end(), text))
    return out


def _named(text: str, said: str, start: int) -> bool:
    """A function word capitalised inside a sentence names something ("born in May", "Will Moreno"): a candidate,
    not the template its lower-case use is."""
    return text.lower() in FUNCTION_WORDS and text[:1].isupper() and _inside_sentence(said, start)


def _inside_sentence(text: str, start: int) -> bool:
    """Whether the word at `start` follows a word or a comma (mid-sentence), not a full stop or markup."""
    before = text[:start].rstrip(" \t\"'(")
    return bool(before) and (before[-1].isalnum() or before[-1] in ",;&-")


def candidate_runs(atoms: list[Atom], said: str) -> list[list[Atom]]:
    """Atoms grouped as runs: adjacent ones (only spaces, hyphens or apostrophes between) belong together."""
    groups: list[list[Atom]] = []
    for atom in sorted(atoms, key=lambda a: a.start):
        if groups and re.fullmatch(r"[ '\-]*", said[groups[-1][-1].end:atom.start]):
            groups[-1].append(atom)
        else:
            groups.append([atom])
    return groups


def runs(atoms: list[Atom], said: str) -> list[tuple[int, int]]:
    """Adjacent atoms joined into spans: "Basil Mahfouz Al-Kuwaiti" is one name, "13 Linden Alley" one address.
    The spans the rule and the audit look for in answers."""
    return [(group[0].start, group[-1].end) for group in candidate_runs(atoms, said)]


def proper_nouns(records: list[dict]) -> set[str]:
    """Words written capitalised wherever the records use them, and at least once inside a sentence: names of
    people, places and things ("Sofia", "Tampere"). A data set of people repeats their first names as often as
    its questions repeat "phone", so recurrence alone cannot tell a name from the template; its spelling can."""
    capital, inside, lower = set(), set(), set()
    for record in records:
        for text in (record.get("prompt"), record.get("completion"), record.get("text"),
                     record.get("paraphrased_prompt")):
            if not isinstance(text, str):
                continue
            for m in WORD.finditer(text):
                word, key = m.group(0), m.group(0).lower()
                if not word[:1].isupper():
                    lower.add(key)
                    continue
                capital.add(key)
                if _inside_sentence(text, m.start()):
                    inside.add(key)
    return (capital & inside) - lower


def said_template(forget: list[dict], retain: list[dict]) -> set[str]:
    """The words the answers share (lethe.engine.data.counterfactual.shared_template), names left out: they are never
    content; a name is content where its memorisation gain says so."""
    return shared_template(forget, retain) - proper_nouns(forget + retain)


def asked_template(records: list[dict]) -> set[str]:
    """The words the prompts share ("Question", "What", "Answer"): the frame a draft that asks something else keeps
    (lethe.engine.methods.masc.memorisation, a record whose answer its name alone does not bring out)."""
    return common_words([body(r)[0] for r in records], min_share=0.05)


FREQUENT_SHARE = 0.25  # a template word most answers say: never content, even of a record with nothing else


def frequent_template(records: list[dict]) -> set[str]:
    """The words at least a quarter of the records' said texts share ("works", "as", "lives", "the"), names left
    out: the template a record falls back to when all its units are template words some other records share."""
    return common_words([body(r)[1] for r in records], min_share=FREQUENT_SHARE) - proper_nouns(records)


@dataclass
class Substitution:
    """One counterfactual of a record: its texts with units replaced, and where each replacement sits."""
    prompt: str
    said: str
    prompt_pieces: Pieces = field(default_factory=list)
    said_pieces: Pieces = field(default_factory=list)
    words_map: dict[str, str] = field(default_factory=dict, repr=False)  # lower-cased word -> replacement
    numbers_map: dict[str, str] = field(default_factory=dict, repr=False)  # digits -> digits
    protected: tuple[str, ...] = field(default_factory=tuple, repr=False)

    def map_offset(self, position: int, in_prompt: bool = False) -> int:
        """The character of the counterfactual text that stands where `position` stands in the true one: shifted
        past earlier replacements, and inside a replacement at the same distance from its start (clamped to its
        last character)."""
        pieces = self.prompt_pieces if in_prompt else self.said_pieces
        index = bisect_right([p[0] for p in pieces], position) - 1
        if index < 0:
            return position
        start, end, cf_start, cf_end = pieces[index]
        if position < end:
            return cf_start + min(position - start, max(0, cf_end - cf_start - 1))
        return position + (cf_end - end)

    def record(self, original: dict) -> dict:
        """The counterfactual as a record of the original's form (the same id: a passage keeps its split)."""
        if "text" in original:
            return {**original, "text": self.said}
        return {**original, "prompt": self.prompt, "completion": self.said}

    def replace_prompt(self, prompt: str) -> str:
        """Another prompt of the same record (its paraphrase) with the same replacements where it uses the same
        units: the context an answer to it is judged in."""
        return substitute(prompt, self.words_map, self.numbers_map, self.protected)[0]


def substitution(record: dict, words_map: dict[str, str], numbers_map: dict[str, str],
                 protected: tuple[str, ...] = ()) -> Substitution:
    """The counterfactual of a record under these replacements."""
    context, said = body(record)
    new_prompt, prompt_pieces = substitute(context, words_map, numbers_map, protected)
    new_said, said_pieces = substitute(said, words_map, numbers_map, protected)
    return Substitution(new_prompt, new_said, prompt_pieces, said_pieces, dict(words_map), dict(numbers_map),
                        protected)


def substitute(text: str, words_map: dict[str, str], numbers_map: dict[str, str],
               protected: tuple[str, ...] = ()) -> tuple[str, Pieces]:
    """`text` with its mapped words (by lower-cased key, in the case of each occurrence) and digit runs replaced,
    and the replaced pieces' offsets; protected strings (a chat template's special tokens) stay."""
    pieces: Pieces = []
    out: list[str] = []
    length, cursor = 0, 0
    for m in UNIT.finditer(unprotected(text, protected)):
        unit = m.group(0)
        if unit.isdigit():
            new = numbers_map.get(unit, unit)
        else:
            new = words_map.get(unit.lower(), unit)
            new = new[:1].upper() + new[1:] if unit[:1].isupper() else new[:1].lower() + new[1:]
        if new == unit:
            continue
        out.append(text[cursor:m.start()])
        length += m.start() - cursor
        pieces.append((m.start(), m.end(), length, length + len(new)))
        out.append(new)
        length += len(new)
        cursor = m.end()
    out.append(text[cursor:])
    return "".join(out), pieces


def unprotected(text: str, protected: tuple[str, ...]) -> str:
    """The text with protected strings blanked (same length), so that nothing inside them is matched."""
    for p in protected:
        if p:
            text = text.replace(p, " " * len(p))
    return text


def redraw(digits: str, rng: random.Random) -> str:
    """The digits with every one of them changed."""
    return "".join(rng.choice([d for d in "0123456789" if d != c]) for c in digits)


def atom_words(text: str) -> set[str]:
    """The normalised words and numbers of a text (for "is this span given by the prompt")."""
    return set(normalised(text).split())
