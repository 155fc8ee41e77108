"""On-policy replay (SPEC section 3): the model's own answers to the forget prompts, refreshed every few steps, read
by the stop rule (lethe.engine.methods.masc.answers judges them) and trained on beside the records themselves."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lethe.engine.data.records import HELD, TEMPLATE, EncodedRecord
from lethe.engine.methods.masc.answers import Answer, Answering
from lethe.engine.model.generation import greedy_agrees

GREEDY = ("prompt", "paraphrase")  # the answers the rule reads
REPLAYED = ("prompt", "paraphrase", "sample")  # the answers training replays


class Replays:
    """The latest replayed answers of each record, and what the greedy ones said."""

    def __init__(self, answering: Answering, reference: Callable, device: Any, seed: int):
        self.answering, self.reference, self.device, self.seed = answering, reference, device, seed
        self.examples: dict[str, list[EncodedRecord]] = {}
        self.refreshes = 0
        self.sampled = 0  # confirmations' draws of samples (each its own seed)
        self.greedy: dict[tuple[str, str], Answer] = {}  # the latest greedy answer of each (record, kind)
        self.verified, self.generated = 0, 0  # a merged copy's greedy answers: read by one pass, or generated
        # Where a loop is not held against the erasure (see start).
        self.base_loops: set[tuple[str, str]] = set()
        self.loop_chance = 0.0  # per record, of a loop neither excuses (see start)
        self.chance_words = 0  # single content words said about anyone, no longer held against an answer (see start)
        self.leaked_own: dict[str, bool] = {}  # per record whose latest judged greedy answers leak: its own content?
        self.untied: set[str] = set()  # records whose latest judged greedy answers said only untied words of others
        self.rides = 0  # forget batches ridden so far
        self.pinned_at: dict[str, int] = {}  # per held answer, the ride at which it last rode as a pin (see riding)

    def start(self, model: Any, records: list[EncodedRecord]) -> dict[str, tuple[bool, bool]]:
        """theta_0's own answers to every record (the first replays), and where it loops: on the record's own prompt
        (a loop the erasure did not make), or on the same question about someone else (a model that never saw the
        record would loop there too: mini-TOFU's retrain reference loops in a fifth of its answers). Then the chance
        that a record loops where neither excuses it (`loop_chance`): asked about a second someone else, the share of
        records whose answer loops where the first two did not. And the single content words any answer about someone
        else says (Answering.hold_chance_words), which no answer is held to."""
        self.base_loops = self.answering.natural_loops(model, records, GREEDY)
        second = self.answering.loops_about_others(model, records, GREEDY, draw=1)
        # Both draws' answers about someone else say which single words are anyone's: judged before any answer is.
        self.chance_words = self.answering.hold_chance_words()
        answers = self._ask(model, records)
        self.base_loops |= {(a.record_id, a.kind) for a in answers if a.looped and a.kind in GREEDY}
        fresh: dict[str, bool] = {}
        for (rid, kind), looped in second.items():
            if (rid, kind) not in self.base_loops:
                fresh[rid] = fresh.get(rid, False) or looped
        self.loop_chance = sum(fresh.values()) / len(fresh) if fresh else 0.0
        return self._keep(answers, records)

    def refresh(self, model: Any, records: list[EncodedRecord], kinds: tuple[str, ...] = REPLAYED
                ) -> dict[str, tuple[bool, bool]]:
        """Ask the model for its answers of these kinds to these records' prompts (by default greedy to the prompt
        and the paraphrase, one sample), keep them as training examples with fresh targets (a kind not asked keeps
        its last example), and say per record whether a greedy answer leaked or looped."""
        return self._keep(self._ask(model, records, kinds), records)

    def _ask(self, model: Any, records: list[EncodedRecord], kinds: tuple[str, ...] = REPLAYED) -> list[Answer]:
        return self.answering.ask(model, records, kinds, seed=self.seed * 7919 + self.refreshes)

    def _keep(self, answers: list[Answer], records: list[EncodedRecord]) -> dict[str, tuple[bool, bool]]:
        examples = [self.answering.replay_example(a) for a in answers]
        self.answering.set_targets(examples, self.reference, self.device, draw=self.refreshes)
        self.refreshes += 1
        fresh: dict[str, list[EncodedRecord]] = {}
        for answer, example in zip(answers, examples):
            fresh.setdefault(answer.record_id, []).append(example)
            if answer.kind in GREEDY:
                self.greedy[(answer.record_id, answer.kind)] = answer
        for rid, group in fresh.items():
            asked = {e.id for e in group}
            group += [e for e in self.examples.get(rid, []) if e.id not in asked]  # kinds not asked this time
        self.examples.update(fresh)
        self.note_leaks(answers)
        return verdicts(answers, records, self.base_loops)

    def note_leaks(self, answers: list[Answer]) -> None:
        """Whose content each record's latest greedy answers give back (its own, or only other records'): counts for
        a failed confirmation's trace (leak_owners), never the text."""
        judged = {a.record_id for a in answers if a.kind in GREEDY}
        for rid in judged:
            self.leaked_own.pop(rid, None)
        self.untied -= judged
        for a in answers:
            if a.kind in GREEDY and a.leaked:
                self.leaked_own[a.record_id] = self.leaked_own.get(a.record_id, False) or a.own_leak
        self.untied |= {a.record_id for a in answers if a.kind in GREEDY and a.untied} - set(self.leaked_own)

    def leak_owners(self, record_ids: list[str]) -> dict[str, int]:
        """Of these records, how many greedy answers leak their own content, how many only another record's, and how
        many leak only in samples (with_samples: no greedy answer of theirs leaked); and, of every record last judged,
        how many answers said no content but other records' single words untied to their subject (subject_tie)."""
        flags = [self.leaked_own[rid] for rid in record_ids if rid in self.leaked_own]
        return {"own": sum(flags), "another_record": len(flags) - sum(flags), "samples": len(record_ids) - len(flags),
                "untied_words": len(self.untied)}

    def judge(self, model: Any, records: list[EncodedRecord], keep_leaks: str | None = None,
              own_content: bool = False) -> dict[str, tuple[bool, bool]]:
        """Per record, whether the model's greedy answers leak or loop (nothing kept: a merged copy's check, unless
        `keep_leaks` names the copy: then each record's first leaking answer is kept as a replay of that name). Where
        one teacher-forced pass shows the model would say the answer last asked of the policy again (greedy_agrees),
        that answer is judged; the records with any other answer are asked in full. `own_content`: an answer leaks
        only by its own record's content (the 4-bit copy's reading, see quantized_check)."""
        known = [(r, a) for r in records for kind in GREEDY if (a := self.greedy.get((r.id, kind))) is not None]
        agrees = greedy_agrees(model, self.answering.tokenizer.pad_token_id, [a.prompt for _, a in known],
                               [a.tokens for _, a in known]) if known else []
        same: dict[str, list[Answer]] = {}
        for (record, answer), ok in zip(known, agrees):
            if ok:
                same.setdefault(record.id, []).append(answer)
        unsettled = [r for r in records if len(same.get(r.id, [])) != self.answering.kinds_of(r, GREEDY)]
        redo = {r.id for r in unsettled}
        answers = [a for r in records if r.id not in redo for a in same[r.id]]
        answers += self.answering.ask(model, unsettled, GREEDY) if unsettled else []
        self.verified += len(records) - len(unsettled)
        self.generated += len(unsettled)
        if own_content:
            answers = [replace(a, leaked=a.leaked and self.answering.says_own_content(a)) for a in answers]
        if keep_leaks is not None:
            self.keep_first_leaks(answers, keep_leaks)
        self.note_leaks(answers)
        return verdicts(answers, records, self.base_loops)

    def sample_leaks(self, model: Any, records: list[EncodedRecord], n: int) -> set[str]:
        """The records any of whose n samples (temperature 1) from `model` gives one of their content numbers back
        (Answering.samples): each keeps its first such sample as a replayed answer, trained on until a later
        confirmation finds another."""
        drawn = self.answering.samples(model, records, n, seed=self.seed * 7919 + 104729 + self.sampled)
        self.sampled += 1
        return self.keep_first_leaks(drawn)

    def keep_first_leaks(self, answers: list[Answer], name: str | None = None) -> set[str]:
        """Each record's first leaking answer kept as a replayed example (under `name`, else its kind, in place of
        the last one so named), trained on until another replaces it; returns the records' ids."""
        first: dict[str, Answer] = {}
        for answer in answers:
            if answer.leaked:
                first.setdefault(answer.record_id, answer)
        examples = [self.answering.replay_example(a) for a in first.values()]
        if name is not None:  # beside the policy's own answers of the same kind, which its refreshes replace
            examples = [replace(e, id=f"{rid}#{name}") for rid, e in zip(first, examples)]
        if examples:
            self.answering.set_targets(examples, self.reference, self.device, draw=self.refreshes)
        for rid, example in zip(first, examples):
            self.examples[rid] = [e for e in self.examples.get(rid, []) if e.id != example.id] + [example]
        return set(first)

    def riding(self, chosen: list[EncodedRecord], size: int, rng: random.Random, pins: int = 0,
               closed: Callable[[str], bool] | None = None) -> list[EncodedRecord]:
        """At most `size` answers to ride along with a forget batch: one of each chosen record's own (one that leaks
        or loops first), then others, those that leak or loop first; and `pins` clean greedy answers of records
        `closed` says are closed, those ridden longest ago first, every answer token HELD (kept the argmax with a
        margin: a closed record is trained no more, and without them its greedy answer flips at near ties while the
        others train)."""
        chosen_ids = {r.id for r in chosen}
        extra = [max(group, key=lambda e: (flagged(e), rng.random())) for r in chosen
                 if (group := self.examples.get(r.id))][:size]
        others = [e for rid, group in self.examples.items() if rid not in chosen_ids for e in group]
        rng.shuffle(others)
        others.sort(key=flagged, reverse=True)
        riding = extra + others[:max(0, size - len(extra))]
        self.rides += 1
        if pins and closed is not None:
            taken = {e.id for e in riding}
            held = [e for rid, group in self.examples.items() if rid not in chosen_ids and closed(rid)
                    for e in group if e.id.rsplit("#", 1)[1] in GREEDY and not flagged(e) and e.id not in taken]
            held.sort(key=lambda e: self.pinned_at.get(e.id, -1))  # stable: ties keep the examples' order
            for example in held[:pins]:
                self.pinned_at[example.id] = self.rides
                riding.append(replace(example, focus=[HELD if k >= example.prompt_len else f
                                                      for k, f in enumerate(example.focus or [])]))
        return riding

    @property
    def replayed_ids(self) -> list[str]:
        return sorted(self.examples)


def flagged(example: EncodedRecord) -> bool:
    """Whether an answer gives content back or loops (some token of it is suppressed)."""
    return any(f != TEMPLATE for f in (example.focus or [])[example.prompt_len:])


def verdicts(answers: list[Answer], records: list[EncodedRecord], base_loops: set[tuple[str, str]] | None = None
             ) -> dict[str, tuple[bool, bool]]:
    """Per record: (some greedy answer leaked, some greedy answer looped where a loop is held against it)."""
    out = {r.id: (False, False) for r in records}
    for a in answers:
        if a.kind in GREEDY:
            leaked, looped = out[a.record_id]
            new_loop = a.looped and (a.record_id, a.kind) not in (base_loops or set())
            out[a.record_id] = (leaked or a.leaked, looped or new_loop)
    return out
