"""Memorisation gain, and counterfactuals written by theta_0 (SPEC section 3).

For each record DRAWS counterfactual drafts are written together, left to right, one unit at a time:

- a name or a number of the prompt (who or what the record is about) is always replaced, and so is one in the part
  of a passage before its continuation;
- a candidate atom s of the said text (lethe.engine.methods.masc.content) is measured first, by its memorisation gain

      gain(s) = log p_0(s | c_s) - mean_j log p_0(s | c_s^j),

  c_s the record before s and c_s^j draft j before s (the same record about someone else, its content so far
  replaced); s is the record's content where gain >= min_gain (or, if the request names secrets, where it lies in
  one), and is then replaced in every draft; otherwise it stays, as the template does. A name that the request's
  records say and no kept record does (`own_names`) is content whatever its gain: the drafts' "someone else" is
  still asked in the record's frame, and a memorised model gives such a frame the erased person's name in the drafts
  too ("The author's full name is Elvin ..." whatever birthplace the question names: 0.97 nats), so the gain misses
  the one thing a model that never saw the records could not say;
- a replaced word is drawn from theta_0's own next-token distribution given the draft so far, as a word of the same
  kind (a new word where the original began one, capitalised where it was) among its DRAW_TOP likeliest, never the
  first token of a word its record's drafts replace or of a forget record's name, then its most likely continuation
  pieces; digits are redrawn. A name (of the prompt, or a proper noun) is drawn uniformly among the DRAW_TOP
  likeliest names the records use that no forget record says, other words in proportion to theta_0. Drawn in
  proportion, a memorised model writes the first name it knows best and then that person's last name, so the
  "someone else" was a person it knows, and theta_0's prediction there, the target, was that person's facts (a forget
  answer then said a kept customer's occupation and phone number); drawn among any capitalised tokens, off the
  records' paths, it wrote "Tanaka The"; drawn among every name the records use, the draft of one erased customer was
  often another erased customer, whose facts the target then gave (the rule counted them as a leak: the record never
  closed). Mixed names of kept people are people nobody knows.
- a record none of whose candidate atoms reaches min_gain is one whose question, not its name, brings its answer out
  ("How has Carmen Montenegro's Historical Fiction Excellence Award affected her career?": the drafts keep the
  award, theta_0 answers them with the record's own words, and no word gains 2 nats). It is measured again
  against drafts that also ask something else (every prompt word outside the template and the prompts' shared frame
  replaced); if still none reaches min_gain, the atoms within FALLBACK_BAND nats of its best gain are its content,
  so that its erasure suppresses what is most its own and never the name its prompt gives, as suppressing the whole
  record did. Its drafts are then written a third time, asking its own question with that content replaced: their
  theta_0 predictions are the targets, and an answer to another question is no destination.

A word any context predicts scores about 0 (template, generic words, a street's "Lane"), and so does the "555"
every phone number of a data set starts with; a fact the model holds about this record only scores high. Drafts
in theta_0's own words keep the contexts ones a model that never saw the record would answer in: words drawn at
random from other records ("the environment name of the motivates author") make every next word look surprising.
The mean of the log-probabilities (not of the probabilities) keeps one draft that happens to name someone the model
knows from cancelling the others.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from lethe.engine.contract.chat_format import RENDERED
from lethe.engine.data.counterfactual import body, words
from lethe.engine.data.records import EncodedRecord, collate
from lethe.engine.methods.masc.content import (
    DRAWS,
    UNIT,
    Atom,
    Substitution,
    redraw,
    substitute,
    substitution,
    unprotected,
)
from lethe.engine.methods.masc.token_kinds import TokenKinds, token_kinds

MAX_PIECES = 4  # tokens of a drawn word
REDRAWS = 3  # draws of a word that keeps coming out as a forget record's name
DRAW_TOP = 8  # a replacement's first token is drawn among theta_0's likeliest tokens of its kind (not the tail)
FALLBACK_BAND = 1.0  # nats below a record's best gain that its content reaches when no atom reaches min_gain
Offsets = list[tuple[int, int] | None]


@dataclass(frozen=True)
class Unit:
    """A unit the writer visits (the first occurrence of its key)."""
    in_prompt: bool
    start: int
    end: int
    text: str
    atom: Atom | None  # a candidate atom of the said text: its gain decides; None: always replaced
    name: bool = False  # a name or a proper noun: its replacement is drawn uniformly (see the module's docstring)

    @property
    def key(self) -> str:
        return self.text.lower()


def visits(record: dict, candidates: list[Atom], names: set[str], from_char: int,
           protected: tuple[str, ...], template: AbstractSet[str] | None = None) -> list[Unit]:
    """The units a record's drafts visit, in reading order: names and numbers of the prompt (and of a passage's
    context part; with `template`, every prompt word not in it too), then the said text's names and candidate
    atoms; each key once."""
    context, said = body(record)
    by_start = {a.start: a for a in candidates}
    out, seen = [], set()
    for in_prompt, text in ((True, context), (False, said)):
        for m in UNIT.finditer(unprotected(text, protected)):
            unit, key = m.group(0), m.group(0).lower()
            if key in seen:
                continue
            atom = None if in_prompt else by_start.get(m.start())
            asked = in_prompt and template is not None and len(unit) > 1 and key not in template
            always = (in_prompt or m.start() < from_char) and (unit.isdigit() or key in names) or asked
            if atom is not None or always:
                seen.add(key)
                out.append(Unit(in_prompt, m.start(), m.end(), unit, atom, not unit.isdigit() and key in names))
    return out


@dataclass
class Draft:
    """One counterfactual being written."""
    record: dict
    rng: random.Random
    generator: torch.Generator
    words: dict[str, str] = field(default_factory=dict)
    numbers: dict[str, str] = field(default_factory=dict)

    def before(self, unit: Unit, protected: tuple[str, ...]) -> tuple[str, str, str]:
        """(the draft's prompt so far, its said text so far, the whitespace before the unit, left out of them)."""
        context, said = body(self.record)
        if unit.in_prompt:
            text = substitute(context[:unit.start], self.words, self.numbers, protected)[0]
            return text.rstrip(), "", text[len(text.rstrip()):]
        prompt = substitute(context, self.words, self.numbers, protected)[0]
        text = substitute(said[:unit.start], self.words, self.numbers, protected)[0]
        return prompt, text.rstrip(), text[len(text.rstrip()):]


def _ids(draft: Draft, prompt: str, said: str, tokenizer) -> list[int]:
    chat = bool(draft.record.get(RENDERED))
    ids = tokenizer(prompt, add_special_tokens=not chat)["input_ids"] if prompt else []
    if "text" in draft.record:  # a passage: one text, special tokens at its start
        ids = tokenizer(said, add_special_tokens=True)["input_ids"] if said else []
    elif said:
        ids = ids + tokenizer(said, add_special_tokens=False)["input_ids"]
    return ids


@torch.no_grad()
def _forward(reference: Callable, rows: list[list[int]], pad_id: int, device, batch_size: int,
             keep: list[int] | None = None) -> list[torch.Tensor]:
    """theta_0's log-probabilities at the last keep[i] positions of each row ([keep, V], CPU; all positions without
    `keep`): only what is read is normalised and kept."""
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = [EncodedRecord("", ids, list(ids), 1) for ids in rows[start:start + batch_size]]
        logits = reference(collate(chunk, pad_id).to(device))
        for i, r in enumerate(chunk):
            n = len(r.input_ids)
            tail = keep[start + i] if keep is not None else n
            out.append(F.log_softmax(logits[i, n - tail:n].float(), dim=-1).cpu())
    return out


def true_logprobs(reference: Callable, sources: list[dict], tokenizer, device, batch_size: int
                  ) -> list[tuple[torch.Tensor, Offsets]]:
    """Per record, log p_0 of each token given the ones before it (0 at the first) and the token's characters in the
    said text (None in the prompt)."""
    rows, offsets = [], []
    for source in sources:
        context, said = body(source)
        before = [] if "text" in source else (
            tokenizer(context, add_special_tokens=not source.get(RENDERED))["input_ids"] if context else [])
        encoded = tokenizer(said, add_special_tokens="text" in source, return_offsets_mapping=True)
        rows.append(list(before) + list(encoded["input_ids"]))
        said_offsets: Offsets = [tuple(o) if o[1] > o[0] else None for o in encoded["offset_mapping"]]
        prompt_offsets: Offsets = [None] * len(before)
        offsets.append(prompt_offsets + said_offsets)
    out = []
    for ids, logp, o in zip(rows, _forward(reference, rows, tokenizer.pad_token_id, device, batch_size), offsets):
        picked = torch.zeros(len(ids))
        if len(ids) > 1:
            picked[1:] = logp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
        out.append((picked, o))
    return out


def atom_token_logprobs(logprobs: torch.Tensor, offsets: Offsets, atom: Atom) -> torch.Tensor:
    """log p of each token carrying the atom's characters, in order (not the first token of the sequence)."""
    return logprobs[[i for i, o in enumerate(offsets) if i > 0 and o and o[0] < atom.end and atom.start < o[1]]]


def number_token_gains(mine: torch.Tensor, theirs: list[torch.Tensor]) -> list[float] | None:
    """Per token of a number, log p_0 in the record minus the mean over the drafts (each given the number's true
    digits before it): what the record adds to that token. None where a draft tokenised it differently."""
    if not theirs or any(t.shape != mine.shape for t in theirs):
        return None
    return (mine - torch.stack(theirs).mean(0)).tolist()


@dataclass
class Written:
    """What the writer found for one record."""
    substitutions: list[Substitution]
    gains: dict[Atom, float]  # each visited candidate atom's gain
    content: set[str]  # the keys decided content
    # A number's gain token by token (its tokens in the record, in order), where the drafts tokenised it alike: the
    # "19" of a year any context predicts gains about 0, its last two digits the rest (see number_token_gains).
    token_gains: dict[Atom, list[float]] = field(default_factory=dict)


def write_counterfactuals(sources: list[dict], candidates: list[list[Atom]], tokenizer, reference: Callable, device,
                          names: set[str], *, min_gain: float, named: list[set[str] | None], seed: int,
                          from_chars: list[int], template: AbstractSet[str], protected: tuple[str, ...] = (),
                          batch_size: int = 16, own_names: AbstractSet[str] = frozenset()) -> list[Written]:
    """Per record (its source and candidate atoms; `named`: the keys of its named secrets, None if it names none),
    its drafts, its atoms' gains and its content (see the module's docstring; `own_names`: the names only the
    request's records say, content wherever they are a candidate atom). Seeded."""
    plans = [visits(s, c, names, f, protected) for s, c, f in zip(sources, candidates, from_chars)]
    # No draft begins a word its record's drafts replace or a forget record's name, nor draws a name a forget
    # record says: a draft about another erased person made theta_0's prediction there, the target, that person's facts
    # (erasing Sofia trained her answer towards Emeka's phone number, which the rule then counted as a leak).
    forget_names = {u.key for plan in plans for u in plan if u.name}
    spelled = [n[:1].upper() + n[1:] for n in sorted(names - said_words(sources))]
    shared = dict(tokenizer=tokenizer, reference=reference, device=device, min_gain=min_gain, seed=seed,
                  protected=protected, batch_size=batch_size, forget_names=forget_names, own_names=own_names,
                  taken_names=_first_tokens(tokenizer, sorted(forget_names)),
                  name_firsts={gap: sorted({ids[0] for n in spelled if (ids := tokenizer(
                      gap + n, add_special_tokens=False)["input_ids"])}) for gap in ("", " ")})
    written = _write(sources, plans, named, **shared)
    unseen = [r for r, w in enumerate(written) if named[r] is None and not w.content and w.gains]
    if not unseen:
        return written
    subset = [sources[r] for r in unseen]
    wide = _write(subset, [visits(sources[r], candidates[r], names, from_chars[r], protected, template)
                           for r in unseen], [None] * len(unseen), **shared)
    for r, w in zip(unseen, wide):
        w.gains = w.gains or written[r].gains  # (drafts that could not be measured: the first gains decide)
        if not w.content:
            best = max(w.gains.values())
            w.content = {a.key for a, g in w.gains.items() if g >= best - FALLBACK_BAND}
    # The drafts of the targets ask the record's own question: only what the wider drafts found is replaced.
    again = _write(subset, [plans[r] for r in unseen], [w.content for w in wide], **shared)
    for r, w, a in zip(unseen, wide, again):
        written[r] = Written(a.substitutions, w.gains, w.content, w.token_gains)
    return written


def _write(sources: list[dict], plans: list[list[Unit]], named: list[set[str] | None], *, tokenizer,
           reference: Callable, device, min_gain: float, seed: int, protected: tuple[str, ...], batch_size: int,
           forget_names: set[str], taken_names: list[int], name_firsts: dict[str, list[int]],
           own_names: AbstractSet[str] = frozenset()) -> list[Written]:
    """One writing of the records' drafts along their plans (`forget_names`, `taken_names`, `name_firsts`: the names
    of the request, see write_counterfactuals)."""
    pad = tokenizer.pad_token_id
    own = true_logprobs(reference, sources, tokenizer, device, batch_size)
    drafts = [[Draft(s, random.Random(f"{seed}:{s['id']}:cf{j}"),
                     torch.Generator().manual_seed(_seed_of(f"{seed}:{s['id']}:cf{j}"))) for j in range(DRAWS)]
              for s in sources]
    written = [Written([], {}, set()) for _ in sources]
    taken = [sorted(set(taken_names) | set(_first_tokens(tokenizer, [u.text for u in plan if not u.text.isdigit()])))
             for plan in plans]
    for step in range(max((len(p) for p in plans), default=0)):
        work = [(r, d, plans[r][step]) for r in range(len(sources)) if step < len(plans[r]) for d in drafts[r]]
        rows, unit_lengths, gaps = [], [], []
        for _, d, unit in work:
            prompt, said, gap = d.before(unit, protected)
            prefix = _ids(d, prompt, said, tokenizer)
            unit_ids = tokenizer(gap + unit.text, add_special_tokens=False)["input_ids"] if prefix else []
            rows.append(prefix + unit_ids if prefix else [pad])
            unit_lengths.append(len(unit_ids))
            gaps.append(gap if prefix else None)
        # Per row: the prefix's last position (what comes next) and the unit's own tokens.
        logps = _forward(reference, rows, pad, device, batch_size, [n + 1 for n in unit_lengths])
        theirs: dict[int, list[torch.Tensor]] = {}  # per record, each draft's log p of the unit's tokens
        for (r, _, unit), row, logp, n in zip(work, rows, logps, unit_lengths):
            if unit.atom is not None and n:
                tokens = torch.tensor(row[-n:])
                # As atom_token_logprobs reads the record's: the tokens that carry the unit's characters, not a
                # whitespace token of the gap before it (a tokenizer that spells " " apart added one token's log p,
                # about -log V on an untrained model: 5.5 nats of gain where there was none).
                carries = torch.tensor([bool(tokenizer.decode([t]).strip()) for t in row[-n:]])
                theirs.setdefault(r, []).append(logp[:n].gather(1, tokens[:, None]).squeeze(1)[carries])
        replaced = set()
        for r in {r for r, _, _ in work}:
            unit = plans[r][step]
            if unit.atom is None:
                replaced.add(r)
                continue
            mine_tokens = atom_token_logprobs(*own[r], unit.atom)
            drafts_said = theirs.get(r, [])
            gain = float(mine_tokens.sum()) - sum(float(t.sum()) for t in drafts_said) / DRAWS \
                if mine_tokens.numel() and len(drafts_said) == DRAWS else None
            if gain is not None:
                written[r].gains[unit.atom] = gain
                if unit.atom.is_number:
                    token_gains = number_token_gains(mine_tokens, drafts_said)
                    if token_gains is not None:
                        written[r].token_gains[unit.atom] = token_gains
            keys = named[r]
            content = unit.key in keys if keys is not None else \
                gain is not None and gain >= min_gain or unit.name and unit.key in own_names
            if content:
                written[r].content.add(unit.key)
                replaced.add(r)
        drawing = [(i, d, unit, gaps[i]) for i, (r, d, unit) in enumerate(work) if r in replaced]
        for _, d, unit, _ in drawing:
            if unit.text.isdigit():
                d.numbers[unit.key] = redraw(unit.text, d.rng)
        _draw_words([(d, unit, rows[i][:len(rows[i]) - unit_lengths[i]], logps[i], gap, taken[work[i][0]])
                     for i, d, unit, gap in drawing if not unit.text.isdigit() and gap is not None],
                    tokenizer, reference, device, pad, batch_size, name_firsts, forget_names)
    for r, source in enumerate(sources):
        written[r].substitutions = [substitution(source, d.words, d.numbers, protected) for d in drafts[r]]
    return written


def said_words(sources: list[dict]) -> set[str]:
    """The lower-cased words the records say anywhere (prompt, answer, passage, paraphrase)."""
    return {w for s in sources for key in ("prompt", "completion", "text", "paraphrased_prompt")
            if isinstance(text := s.get(key), str) for w in words(text)}


def _first_tokens(tokenizer, texts: list[str]) -> list[int]:
    """The first token of each text, as a word of its own and after a space: what begins one of them."""
    out = set()
    for text in texts:
        for variant in (text, " " + text):
            out.update(tokenizer(variant, add_special_tokens=False)["input_ids"][:1])
    return sorted(out)


def _draw_words(work: list[tuple[Draft, Unit, list[int], torch.Tensor, str, list[int]]], tokenizer,
                reference: Callable, device, pad: int, batch_size: int,
                name_firsts: dict[str, list[int]] | None = None, forbidden: AbstractSet[str] = frozenset()) -> None:
    """Each draft's replacement of its unit: a first token drawn from theta_0 among tokens of the unit's kind (none
    that begins a word its record's drafts replace or a forget record's name; for a name, one that begins a name of
    the kept records where any does), then the most likely pieces while they continue the word. A word that comes
    out `forbidden` (a forget record's name, its first token shared with a kept one's) is drawn again without that
    first token, up to REDRAWS times (then kept: another person still beats the record's own)."""
    if not work:
        return
    size = work[0][3].shape[-1]
    kinds = token_kinds(tokenizer, size)
    names_only = {gap: torch.zeros(size, dtype=torch.bool) for gap in ("", " ")}
    for gap, firsts in (name_firsts or {}).items():
        names_only[gap][[t for t in firsts if t < size]] = True
    refused: list[list[int]] = [[] for _ in work]
    todo = list(range(len(work)))
    for attempt in range(REDRAWS):
        drawn = _drawn_words([work[i] for i in todo], [refused[i] for i in todo], kinds, names_only, tokenizer,
                             reference, device, pad, batch_size)
        again = []
        for i, (word, first) in zip(todo, drawn):
            if word.lower() in forbidden and first is not None and attempt < REDRAWS - 1:
                refused[i].append(first)
                again.append(i)
            elif word.isalpha():
                d, unit = work[i][0], work[i][1]
                d.words[unit.key] = word
        todo = again
        if not todo:
            break


def _drawn_words(work: list[tuple[Draft, Unit, list[int], torch.Tensor, str, list[int]]], refused: list[list[int]],
                 kinds: TokenKinds, names_only: dict[str, torch.Tensor], tokenizer, reference: Callable, device,
                 pad: int, batch_size: int) -> list[tuple[str, int | None]]:
    """One draw per unit (see _draw_words): the word, and its first token (None: nothing could be drawn)."""
    chosen: list[list[int]] = []
    for (d, unit, _, logp, gap, taken), extra in zip(work, refused):
        capital = unit.text[:1].isupper()
        allowed = ((kinds.new_upper if capital else kinds.new_lower) if gap else
                   (kinds.bare_upper if capital else kinds.bare_lower)).clone()
        allowed[tokenizer(gap + unit.text, add_special_tokens=False)["input_ids"][:1] + taken + extra] = False
        names = names_only[" " if gap else ""]
        if unit.name and bool((allowed & names).any()):
            allowed &= names
        if not bool(allowed.any()):
            chosen.append([])
            continue
        # In log space: a memorised model's probabilities off its path underflow to 0 in float32.
        top = logp[0].float().masked_fill(~allowed, float("-inf")).topk(min(DRAW_TOP, int(allowed.sum())))
        weights = torch.isfinite(top.values).float() if unit.name else torch.softmax(top.values, 0)
        pick = int(torch.multinomial(weights, 1, generator=d.generator))
        chosen.append([int(top.indices[pick])])
    done = [not c for c in chosen]
    for _ in range(MAX_PIECES - 1):
        going = [i for i in range(len(work)) if not done[i]]
        if not going:
            break
        logps = _forward(reference, [work[i][2] + chosen[i] for i in going], pad, device, batch_size, [1] * len(going))
        for i, logp in zip(going, logps):
            best = int(logp[-1].argmax())
            if bool(kinds.piece[best]):
                chosen[i].append(best)
            else:
                done[i] = True
    return [(tokenizer.decode(tokens).strip() if tokens else "", tokens[0] if tokens else None) for tokens in chosen]


def _seed_of(tag: str) -> int:
    """A seed of 32 bits that differs wherever the tag does: torch's CPU generator keeps only the low 32 bits of
    a seed, and the last bytes of two drafts' tags ("...:cf0", "...:cf1") differed only above them, so every draft
    of a record drew the same words."""
    return int(hashlib.sha256(tag.encode()).hexdigest()[:8], 16)
