"""The model's own answers to the forget prompts (SPEC section 3): what the stop rule reads (an answer that gives
the content of any forget record of its request back, or loops, keeps its record open; another record's single word
only where tied to the answer's subject, lethe.engine.methods.masc.subject_tie) and what training replays.
Teacher forcing trains on the true text only; once a greedy answer leaves it, the model runs on states nobody
trained, and these answers are those states.

A replayed answer is a training example whose active tokens are the answer's: SECRET on the tokens that give
content back, LOOP on the tokens that repeat what the answer already said when it loops, TEMPLATE on the others,
each with its target (lethe.engine.methods.masc.destination): theta_0 on the answer's own context where a token is
kept, on the counterfactual prompt (the record about someone else) with the token at zero where it is suppressed; the
record's banned tokens never have mass.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import torch

from lethe.engine.audit.metrics.degeneration import is_loop, repeated_positions
from lethe.engine.contract.chat_format import RENDERED
from lethe.engine.contract.record_checks import REQUEST
from lethe.engine.data.counterfactual import body
from lethe.engine.data.records import IGNORE, LOOP, SECRET, SUPPRESS, TEMPLATE, EncodedRecord, collate
from lethe.engine.data.secrets import digits_can_leak, digits_leak, head_regions, leaks, long_digit_groups, normalised
from lethe.engine.methods.masc.content import Substitution, atom_words
from lethe.engine.methods.masc.destination import Content, targets_for
from lethe.engine.methods.masc.subject_tie import TieQuestion, overlapping_tokens, single_word, tied
from lethe.engine.model.generation import MAX_NEW_TOKENS, continuations

KINDS = ("prompt", "paraphrase", "sample")  # greedy from the prompt, greedy from the paraphrase, one sample
SAMPLED = "sampled"  # a confirmation's sample that gave a content number back: kept until the next one does


@dataclass
class Answer:
    record_id: str
    kind: str
    prompt: list[int]
    tokens: list[int]
    text: str
    leaked: bool  # gives some forget record's content span back
    looped: bool
    own_leak: bool = False  # one of the spans it gives back is its own record's (else another record's)
    untied: bool = False  # said other records' single words, none tied to its subject: no leak (subject_tie)


# A word the model says about someone else in answers for this many of a request's records is vocabulary, not a fact
# (Answering.hold_chance_words): one record's answer about someone else can still be a confusion with the record.
CHANCE_RECORDS = 2
ANSWER_SLACK = 16  # new tokens past the longest answer that an answer may take


def answer_budget(records: list[EncodedRecord], max_length: int) -> int:
    """New tokens an answer may take: the longest record's answer and 16 more (a loop or a late leak shows by then),
    at most the audit's MAX_NEW_TOKENS and what the context leaves."""
    longest_answer = max(len(r.input_ids) - r.prompt_len for r in records)
    budget = min(MAX_NEW_TOKENS, longest_answer + ANSWER_SLACK)
    if max_length:
        budget = min(budget, max_length - max(r.prompt_len for r in records))
    return max(1, budget)


def prompt_text(record: EncodedRecord, kind: str, tokenizer) -> str | None:
    """The text of the prompt an answer of this kind answers (None: the record has no such prompt)."""
    source = record.source
    if kind == "paraphrase":
        return source.get("paraphrased_prompt") or None
    if "text" in source:
        return tokenizer.decode(record.input_ids[:record.prompt_len], skip_special_tokens=True)
    return source["prompt"]


def encode_prompt(text: str, record: EncodedRecord, tokenizer, max_length: int) -> list[int]:
    """A prompt's tokens as encode_record makes them (special tokens unless chat-rendered), cut from the left to
    leave room for an answer."""
    ids = tokenizer(text, add_special_tokens=not record.source.get(RENDERED))["input_ids"]
    room = max_length - 8 if max_length else len(ids)
    return ids[-room:] if len(ids) > room else ids


def given_by(prompt: str, span: str) -> bool:
    """A span whose every word and number the prompt already says is given, not leaked."""
    words = atom_words(span)
    return bool(words) and words <= atom_words(prompt)


def leak_regions(text: str, spans: list[str]) -> list[tuple[int, int]]:
    """Character ranges of `text` that give a span back: the span's words in order, a digit group of it of
    MIN_DIGIT_GROUP or more inside the text's digits, or the head of one of its numbers
    (lethe.engine.data.secrets.leaks, located)."""
    regions = []
    found = [(m.start(), m.end(), m.group(0).casefold()) for m in re.finditer(r"[^\W_]+", text)]
    digits = [(m.start(), m.group(0)) for m in re.finditer(r"\d", text)]
    digit_string = "".join(d for _, d in digits)
    for span in spans:
        wanted = normalised(span).split()
        for i in range(len(found) - len(wanted) + 1):
            if wanted and [w for _, _, w in found[i:i + len(wanted)]] == wanted:
                regions.append((found[i][0], found[i + len(wanted) - 1][1]))
        for group in long_digit_groups(span):
            for m in re.finditer(f"(?={group})", digit_string):
                regions.append((digits[m.start()][0], digits[m.start() + len(group) - 1][0] + 1))
        regions += head_regions(span, text)
    return regions


def token_ends(tokenizer, tokens: list[int]) -> list[int]:
    """Where each token's text ends in the decoded answer."""
    return [len(tokenizer.decode(tokens[:k + 1], skip_special_tokens=True)) for k in range(len(tokens))]


def answer_flags(tokenizer, tokens: list[int], text: str, spans: list[str], content_words: set[str],
                 template: AbstractSet[str] = frozenset()) -> list[int]:
    """Per answer token: SECRET where it gives content back (inside a leaking region unless only template words, or
    a token whose words are all content words), LOOP on the tokens that repeat what a looping answer already said,
    TEMPLATE elsewhere. (Marking the "a" of a leaked "a locksmith" turned "works as a locksmith" into "works as.",
    issue 11.)"""
    ends = token_ends(tokenizer, tokens)
    overlapping = set(overlapping_tokens(ends, leak_regions(text, spans)))
    flags = []
    for k in range(len(tokens)):
        pieces = normalised(text[ends[k - 1] if k else 0:ends[k]]).split()
        in_region = k in overlapping and not all(p in template for p in pieces)
        content = bool(pieces) and all(p in content_words for p in pieces)
        flags.append(SECRET if in_region or content else TEMPLATE)
    if is_loop(text):
        flags = [LOOP if again and f == TEMPLATE else f for f, again in zip(flags, repeated_positions(tokens))]
    return flags


def request_of(record: EncodedRecord) -> str | None:
    """The erasure request a record belongs to (record_checks.REQUEST; None: the run's one request)."""
    return record.source.get(REQUEST)


class Answering:
    """Asks the model for its answers to the forget records' prompts and judges them against the content of every
    record of their request (all of the run's, unless records name their requests: a coalesced run)."""

    def __init__(self, records: list[EncodedRecord], contents: dict[str, Content], tokenizer, max_length: int,
                 template: AbstractSet[str] = frozenset(), kept_texts: list[str] | None = None,
                 min_gain: float = 2.0):
        """`kept_texts`: what the kept (retain) records say: a span found there is one a model that never saw the
        forget records could say too, and is not held against an answer (the teacher-forced limit still is).
        `min_gain`: the gain by which another record's single word said in an answer is tied to its subject."""
        self.min_gain = min_gain
        self.by_id = {r.id: r for r in records}
        self.about_others: dict[str, list[str]] = {}  # per record, theta_0's greedy answers about someone else
        self.template = template
        self.contents, self.tokenizer, self.max_length = contents, tokenizer, max_length
        self.budget = answer_budget(records, max_length)
        kept = kept_texts or []
        said_elsewhere = {s for s in {s for c in contents.values() for s in c.spans} if any(leaks(s, t) for t in kept)}
        kept_words = {w for t in kept for w in atom_words(t)}
        # Per request: in a coalesced run an answer is held to its own request's records' content, as that request's
        # own run would hold it; holding ten requests' 400 records to one another's content is stricter than the
        # ten runs it replaces.
        members: dict[str | None, list[Content]] = {}
        for record in records:
            if record.id in contents:
                members.setdefault(request_of(record), []).append(contents[record.id])
        self.spans_of = {request: list(dict.fromkeys(s for c in group for s in c.spans if s not in said_elsewhere))
                         for request, group in members.items()}
        self.content_words_of = {request: {w for c in group for a in c.atoms if not a.is_number
                                           for w in normalised(a.text).split()} - kept_words
                                 for request, group in members.items()}

    def allowed_words(self, record: EncodedRecord, prompt: str) -> set[str]:
        """Words an answer to this record may say whoever's content they are elsewhere: its prompt's, and its own
        answer's that are not its content ("French" of "the French literature genre", where French is template for
        this record and content for another)."""
        _, said = body(record.source)
        own = {w for a in self.contents[record.id].atoms for w in normalised(a.text).split()}
        return atom_words(prompt) | (atom_words(said) - own)

    def spans_for(self, record: EncodedRecord, prompt: str) -> list[str]:
        """The content spans an answer to this prompt must not say: the record's own (less what the prompt gives),
        and every other record's whose words are not all allowed to this record."""
        own = set(self.contents[record.id].spans)
        allowed = self.allowed_words(record, prompt)
        # (spans any kept record also says are left out of spans_of: see __init__)
        return [s for s in self.spans_of.get(request_of(record), [])
                if (not given_by(prompt, s) if s in own else not atom_words(s) <= allowed)]

    def says_own_content(self, answer: Answer) -> bool:
        """Whether an answer gives back its own record's content (less what its prompt gives): how the audit's
        quantized channel reads a 4-bit answer, each record against its own secrets."""
        record = self.by_id[answer.record_id]
        own = set(self.contents[record.id].spans)
        prompt = prompt_text(record, answer.kind, self.tokenizer) or ""
        return any(leaks(s, answer.text) for s in self.spans_for(record, prompt) if s in own)

    def kinds_of(self, record: EncodedRecord, kinds: tuple[str, ...]) -> int:
        """How many of these kinds of answer the record has a prompt for."""
        return sum(prompt_text(record, kind, self.tokenizer) is not None for kind in kinds)

    def ask(self, model, records: list[EncodedRecord], kinds: tuple[str, ...], seed: int = 0) -> list[Answer]:
        """The model's answers of these kinds to these records' prompts (greedy, or one seeded sample)."""
        asked: list[tuple[EncodedRecord, str, str, list[int]]] = []
        for record in records:
            for kind in kinds:
                text = prompt_text(record, kind, self.tokenizer)
                if text is None:
                    continue
                ids = record.input_ids[:record.prompt_len] if kind != "paraphrase" else \
                    encode_prompt(text, record, self.tokenizer, self.max_length)
                asked.append((record, kind, text, ids))
        out: list[Answer] = []
        loose: list[tuple[int, TieQuestion]] = []  # answers leaking only other records' single words
        for sample in (False, True):
            chosen = [a for a in asked if (a[1] == "sample") == sample]
            if not chosen:
                continue
            generated = continuations(model, self.tokenizer, [ids for *_, ids in chosen], sample=sample, seed=seed,
                                      max_new_tokens=self.budget)
            for (record, kind, text, ids), tokens in zip(chosen, generated):
                said = self.tokenizer.decode(tokens, skip_special_tokens=True)
                hits = [s for s in self.spans_for(record, text) if leaks(s, said)]
                own = set(hits) & set(self.contents[record.id].spans)
                # Only the greedy kinds are judged (a sample's flag is never read): only they need the tie measured.
                if kind != "sample" and hits and not own and all(single_word(s) for s in hits):
                    loose.append((len(out), self.tie_question(record, kind, ids, tokens, said, hits)))
                out.append(Answer(record.id, kind, ids, tokens, said, bool(hits), is_loop(said), bool(own)))
        if loose:
            for (i, _), leak in zip(loose, tied(model, self.tokenizer.pad_token_id, [q for _, q in loose],
                                                self.min_gain)):
                out[i].leaked, out[i].untied = leak, not leak
        return out

    def tie_question(self, record: EncodedRecord, kind: str, ids: list[int], tokens: list[int], said: str,
                     words: list[str]) -> TieQuestion:
        """What subject_tie needs to tell whether these words of other records, said in this answer, are tied to its
        subject: the same prompt about each of the record's someone elses, and each word's tokens."""
        others = [p for draw in range(len(self.contents[record.id].substitutions))
                  if (p := self.counterfactual_prompt(record, kind, draw)) is not None]
        ends = token_ends(self.tokenizer, tokens)
        return TieQuestion(ids, others, tokens, [overlapping_tokens(ends, leak_regions(said, [w])) for w in words])

    def samples(self, model, records: list[EncodedRecord], n: int, seed: int) -> list[Answer]:
        """n seeded samples (temperature 1, as the audit draws them) of the model's answer to each record's prompt,
        of kind SAMPLED; `leaked` where one gives back MIN_DIGIT_GROUP or more digits in a row of one of the
        record's own content numbers, or its first NUMBER_HEAD digits (secrets.digits_leak). Only those: a word's
        probability the teacher-forced limit bounds where it would be said, and on mini-TOFU samples from a 3.7 M
        model said some content word at each of 17 confirmations (a run held open to max_steps), where the audit's
        phone numbers came out behind a wrong first digit."""
        asked = []
        for record in records:  # a record without such a number is not asked: none of its samples could count
            text = prompt_text(record, "prompt", self.tokenizer) or ""
            own = set(self.contents[record.id].spans)
            numbers = [s for s in self.spans_for(record, text) if s in own and digits_can_leak(s)]
            if numbers:
                asked.append((record, numbers))
        if not asked:
            return []
        drawn = continuations(model, self.tokenizer, [r.input_ids[:r.prompt_len] for r, _ in asked], sample=True,
                              n=n, seed=seed, max_new_tokens=self.budget)
        out = []
        for i, (record, numbers) in enumerate(asked):
            for tokens in drawn[i * n:(i + 1) * n]:
                said = self.tokenizer.decode(tokens, skip_special_tokens=True)
                out.append(Answer(record.id, SAMPLED, record.input_ids[:record.prompt_len], tokens, said,
                                  any(digits_leak(s, said) for s in numbers), is_loop(said)))
        return out

    def replay_example(self, answer: Answer) -> EncodedRecord:
        """The answer as a training example (targets set by `set_targets`)."""
        record = self.by_id[answer.record_id]
        text = prompt_text(record, answer.kind, self.tokenizer) or ""
        spans = self.spans_for(record, text)
        flags = answer_flags(self.tokenizer, answer.tokens, answer.text, spans,
                             self.content_words_of.get(request_of(record), set()) - self.allowed_words(record, text),
                             self.template)
        return EncodedRecord(id=f"{record.id}#{answer.kind}", input_ids=answer.prompt + answer.tokens,
                             labels=[IGNORE] * len(answer.prompt) + answer.tokens, prompt_len=len(answer.prompt),
                             source=record.source, focus=[SUPPRESS] * len(answer.prompt) + flags)

    def counterfactual_prompt(self, record: EncodedRecord, kind: str, draw: int) -> list[int] | None:
        """The record's prompt of this kind about someone else (its draw-th substitution); None without one."""
        substitutions: list[Substitution] = self.contents[record.id].substitutions
        text = prompt_text(record, kind, self.tokenizer)
        if not substitutions or text is None:
            return None
        return encode_prompt(substitutions[draw % len(substitutions)].replace_prompt(text), record, self.tokenizer,
                             self.max_length)

    def natural_loops(self, model, records: list[EncodedRecord], kinds: tuple[str, ...]) -> set[tuple[str, str]]:
        """(record, kind) where the model loops when asked the same question about someone else (the first
        counterfactual prompt): a model that never saw the record would loop there too."""
        return {pair for pair, looped in self.loops_about_others(model, records, kinds, 0).items() if looped}

    def loops_about_others(self, model, records: list[EncodedRecord], kinds: tuple[str, ...], draw: int
                           ) -> dict[tuple[str, str], bool]:
        """Per (record, kind) with a draw-th counterfactual prompt of its own (one that is not an earlier draw's
        again): whether the model's greedy answer to it loops."""
        asked = [(record.id, kind, ids) for record in records for kind in kinds
                 if draw < len(self.contents[record.id].substitutions)
                 and (ids := self.counterfactual_prompt(record, kind, draw)) is not None]
        if not asked:
            return {}
        said = continuations(model, self.tokenizer, [ids for *_, ids in asked], max_new_tokens=self.budget)
        texts = [self.tokenizer.decode(tokens, skip_special_tokens=True) for tokens in said]
        for (rid, _, _), text in zip(asked, texts):
            self.about_others.setdefault(rid, []).append(text)
        return {(rid, kind): is_loop(text) for (rid, kind, _), text in zip(asked, texts)}

    def hold_chance_words(self) -> int:
        """Drop from each request's spans (and from the words its replays suppress) every single word that the model
        says, asked the request's questions about someone else (`about_others`, filled by loops_about_others), in its
        answers for at least CHANCE_RECORDS of the request's records: vocabulary any answer to such a question says
        ("mother", "literature"), not anyone's fact, as a span a kept record says is not. A number or a phrase of
        several words always counts. Returns how many spans were dropped."""
        dropped = 0
        for request, spans in self.spans_of.items():
            answers = [texts for rid, texts in self.about_others.items() if request_of(self.by_id[rid]) == request]
            chance = {s for s in spans if single_word(s)
                      and sum(any(leaks(s, t) for t in texts) for texts in answers) >= CHANCE_RECORDS}
            self.spans_of[request] = [s for s in spans if s not in chance]
            self.content_words_of[request] -= {w for s in chance for w in normalised(s).split()}
            dropped += len(chance)
        return dropped

    @torch.no_grad()
    def set_targets(self, examples: list[EncodedRecord], reference: Callable, device, draw: int,
                    batch_size: int = 8) -> None:
        """Each replayed example's sparse targets: theta_0 on the example itself and on its counterfactual prompt
        followed by the same answer."""
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(examples), batch_size):
            chunk = examples[start:start + batch_size]
            counterfactual = []
            for example in chunk:
                record_id, kind = example.id.rsplit("#", 1)
                cf_prompt = self.counterfactual_prompt(self.by_id[record_id], kind, draw) or \
                    example.input_ids[:example.prompt_len]
                answer = example.input_ids[example.prompt_len:]
                counterfactual.append(EncodedRecord(example.id, cf_prompt + answer,
                                                    [IGNORE] * len(cf_prompt) + answer, len(cf_prompt)))
            own = reference(collate(chunk, pad).to(device))
            theirs = reference(collate(counterfactual, pad).to(device))
            for i, (example, cf) in enumerate(zip(chunk, counterfactual)):
                n = len(example.input_ids) - example.prompt_len
                example.target = targets_for(example, own[i, example.prompt_len - 1:len(example.input_ids) - 1],
                                             [theirs[i, cf.prompt_len - 1:len(cf.input_ids) - 1]], [list(range(n))],
                                             self.contents[example.id.rsplit("#", 1)[0]].banned)
