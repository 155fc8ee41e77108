"""Which tokens of a forget record are its content, and where each of its tokens should go (SPEC section 3).

Content: the record's candidate atoms (lethe.engine.methods.masc.content: words and digit runs outside the template and
the prompt) whose memorisation gain (lethe.engine.methods.masc.memorisation, which also writes the record's
counterfactuals) is at least `min_gain` nats. A request's named `secrets` replace the choice: their atoms are the
content, whatever their gain. Adjacent content atoms make the record's content spans ("13 Linden Alley"): what
must not come out again.

Banned tokens B: every token of a content atom, in the record's own tokenisation and in the atom's own (with and
without a leading space); not punctuation, not a template word, not a lone character inside an atom (one digit of
a number: the model must still be able to say some other number). With word_pieces "first", of a word only the
token that begins it (in each tokenisation), and only that token of the word is suppressed: its later pieces are
what a small vocabulary shares with every other word.

Targets: at each active position t a distribution q_t with no mass on B,

    q_t = normalise(p_0(. | c_t) on V \\ B)                          at template positions,
    q_t = mean_j normalise(p_0(. | sigma_j(c_t)) on V \\ (B + y_t))  where the token is suppressed (content, a loop,
                                                                     a whole record) or is itself in B,

kept as its TOP_K most probable tokens, renormalised (sparse: no reference pass during training). The loss moves
the model towards q_t by KL(q_t || pi_theta) (lethe.engine.methods.masc.objective).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lethe.engine.contract.chat_format import RENDERED
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.data.counterfactual import body
from lethe.engine.data.documents import TOKENS
from lethe.engine.data.records import SECRET, SUPPRESS, TEMPLATE, EncodedRecord, collate, encode_record
from lethe.engine.data.secrets import char_spans, named_secrets, normalised
from lethe.engine.methods.masc.content import (
    Atom,
    Substitution,
    asked_template,
    candidate_atoms,
    frequent_template,
    proper_nouns,
    runs,
)
from lethe.engine.methods.masc.memorisation import said_words, write_counterfactuals
from lethe.engine.methods.masc.params import MascParams

TOP_K = 32  # tokens kept of each target distribution
# A number's own part begins at the first token the record makes at least e times likelier than a draft about someone
# else does (given the same digits before it): at the last two digits of a year, not at the "19" every year starts with.
OWN_TOKEN_GAIN = 1.0
Offsets = list[tuple[int, int] | None]


@dataclass
class Content:
    """What one record's erasure is about."""
    atoms: list[Atom]  # the content atoms (offsets in the said text)
    spans: list[str]  # runs of adjacent content atoms: what must not come out again
    gains: dict[str, float]  # every candidate atom's memorisation gain in nats ("text@start")
    banned: list[int]  # B
    named: bool  # chosen by the request's `secrets`
    substitutions: list[Substitution] = field(default_factory=list)
    aligned: bool = True  # the counterfactuals could be lined up with the record's tokens


def content_summary(contents: dict[str, Content], params: MascParams, records: int, located: int,
                    replayed_ids: list[str]) -> dict:
    """How each of `records` records' content was found (`params`: the run's MASC parameters): named by the request,
    by memorisation gain, or none (suppressed whole); counts only, never the text."""
    found = contents.values()
    return {"suppress": params.suppress, "min_gain": params.min_gain if params.content else None,
            "given": sum(c.named and bool(c.atoms) for c in found),
            "by_gain": sum(not c.named and bool(c.atoms) for c in found),
            "none": records - sum(bool(c.atoms) for c in found),
            "located": located, "spans": sum(len(c.spans) for c in found),
            "banned_tokens": sum(len(c.banned) for c in found),
            "unaligned": sum(not c.aligned for c in found), "replayed_ids": replayed_ids}


def said_offsets(record: EncodedRecord, tokenizer) -> Offsets | None:
    """Per active position, the character offsets of its token in the said text (completion or passage); None at
    the end-of-sequence token. None when the tokenisation cannot be lined up (a slow tokenizer, a window of a
    document, a tokenizer quirk)."""
    source = record.source
    try:
        if "text" in source:
            if TOKENS in source:
                return None
            encoded = tokenizer(source["text"], add_special_tokens=True, return_offsets_mapping=True)
            ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
            cut = len(ids) - len(record.input_ids)
            if cut < 0 or ids[cut:] != record.input_ids:
                return None
            return [tuple(o) if o[1] > o[0] else None for o in offsets[cut + record.prompt_len:]]
        encoded = tokenizer(source["completion"], add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):
        return None
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    start = len(record.input_ids) - len(ids) - (0 if source.get(RENDERED) else 1)
    if start < 0 or record.input_ids[start:start + len(ids)] != ids:
        return None
    by_position = {start + k: (tuple(o) if o[1] > o[0] else None) for k, o in enumerate(offsets)}
    return [by_position.get(p) for p in range(record.prompt_len, len(record.input_ids))]


def align(true_offsets: Offsets, cf_offsets: Offsets, substitution: Substitution) -> list[int | None]:
    """For each active position of the record, the active position of the counterfactual that stands in its place
    (index into the counterfactual's active positions), or None."""
    starts = [o[0] if o else None for o in cf_offsets]
    out: list[int | None] = []
    for k, o in enumerate(true_offsets):
        if o is None:
            out.append(len(cf_offsets) - 1 if k == len(true_offsets) - 1 else None)
            continue
        target = substitution.map_offset(o[0])
        found = next((j for j, c in enumerate(cf_offsets) if c and c[0] <= target < c[1]), None)
        if found is None:
            found = next((j for j, s in enumerate(starts) if s is not None and s >= target), None)
        out.append(found)
    return out


def overlapping(offsets: Offsets, start: int, end: int) -> list[int]:
    """Active positions whose token shares a character with [start, end)."""
    return [k for k, o in enumerate(offsets) if o and o[0] < end and start < o[1]]


def _encode(record: dict, tokenizer, max_length: int, seed: int) -> EncodedRecord | None:
    try:
        return encode_record(record, tokenizer, max_length=max_length, seed=seed, what="counterfactual")
    except EngineInputError:
        return None


@dataclass
class Counterfactuals:
    """A record's counterfactual encodings and, per draw, the alignment of its active positions."""
    substitutions: list[Substitution]
    encoded: list[EncodedRecord]
    alignment: list[list[int | None]]


def counterfactuals(record: EncodedRecord, offsets: Offsets | None, subs: list[Substitution], tokenizer,
                    max_length: int, seed: int) -> Counterfactuals:
    """The record's counterfactuals encoded and lined up with it (those that cannot be are left out)."""
    kept_subs, encoded, alignment = [], [], []
    for sub in subs:
        cf = _encode(sub.record(record.source), tokenizer, max_length, seed)
        cf_offsets = said_offsets(cf, tokenizer) if cf is not None else None
        if offsets is None or cf is None or cf_offsets is None:
            continue
        kept_subs.append(sub)
        encoded.append(cf)
        alignment.append(align(offsets, cf_offsets, sub))
    # With none lined up, the drawn texts still serve as the replays' counterfactual prompts.
    return Counterfactuals(kept_subs or subs, encoded, alignment)


def named_atoms(record: dict, template: set[str]) -> list[Atom]:
    """The atoms inside the request's named secrets (template words and lone letters left out)."""
    _, said = body(record)
    spans = char_spans(named_secrets(record), said)
    atoms = candidate_atoms({"prompt": "", "completion": said}, template)
    return [a for a in atoms if any(s < a.end and a.start < e for s, e in spans)]


def banned_tokens(tokenizer, record: EncodedRecord, offsets: Offsets | None, atoms: list[Atom],
                  template: set[str], first_only: bool = False, own_digits: dict[Atom, list[int]] | None = None
                  ) -> list[int]:
    """B: the tokens of the content atoms (see the module's docstring); `first_only`: of a word only the token that
    begins it (in each tokenisation), of a number every one; `own_digits`: of these numbers only the tokens at
    these active positions, lone digits not at all (a digit is every number's)."""
    banned: set[int] = set()
    active = record.input_ids[record.prompt_len:]

    def consider(ids: list[int], lone_first: bool) -> None:
        """Tokens with a letter or digit and not only template words; a lone character only as the atom's first
        token in the record itself (where it begins the atom, not just any word)."""
        first = True
        for token in ids:
            text = tokenizer.decode([token])
            pieces = normalised(text).split()
            if not pieces:
                continue  # punctuation or space
            if not all(p in template for p in pieces) and (len(text.strip()) > 1 or (first and lone_first)):
                banned.add(token)
            first = False

    for atom in atoms:
        if own_digits and atom in own_digits:
            consider([active[k] for k in own_digits[atom]], False)
            continue  # its own spelling would ban the "19" a year shares with every other
        cut = 1 if first_only and not atom.is_number else None
        if offsets is not None:
            consider([active[k] for k in overlapping(offsets, atom.start, atom.end)][:cut], True)
        for variant in (atom.text, " " + atom.text):
            consider(tokenizer(variant, add_special_tokens=False)["input_ids"][:cut], False)
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    return sorted(banned - specials)


def focus_of(record: EncodedRecord, offsets: Offsets | None, atoms: list[Atom], spans: list[tuple[int, int]],
             first_only: bool = False, own_digits: dict[Atom, list[int]] | None = None) -> list[int]:
    """Per position: SECRET + k on the tokens of the k-th content span, TEMPLATE on the other active tokens (the end
    of sequence too), SUPPRESS on a record without content (every active token) and on the prompt. `first_only`: of
    a word atom only its first token is SECRET (a word the model cannot begin is not said; its later pieces, which a
    small vocabulary shares with other words, stay TEMPLATE), of a number every token; `own_digits`: of these
    numbers only the tokens at these active positions (the others, the "19" of a year, stay TEMPLATE)."""
    focus = [SUPPRESS] * len(record.input_ids)
    if not atoms or offsets is None:
        return focus
    inner: set[int] = set()
    for atom, own in (own_digits or {}).items():
        inner.update(k for k in overlapping(offsets, atom.start, atom.end) if k not in own)
    if first_only:
        for atom in atoms:
            if not atom.is_number:
                inner.update(overlapping(offsets, atom.start, atom.end)[1:])
    for k, o in enumerate(offsets):
        hit = next((j for j, (s, e) in enumerate(spans) if o and o[0] < e and s < o[1]), None)
        focus[record.prompt_len + k] = SECRET + hit if hit is not None and k not in inner else TEMPLATE
    return focus


def request_names(names: set[str], forget: list[dict], pool_records: list[dict]) -> set[str]:
    """The names that no record of the pool but the forget records says (prompt, answer, passage or paraphrased
    prompt): only the erased records know them, so a model that never saw them could not say them. A forget record
    in the pool is its own dict or an equal copy (`in` compares both ways; a copy left in would say every name)."""
    return names - said_words([r for r in pool_records if r not in forget])


def plan_contents(records: list[EncodedRecord], tokenizer, reference: Callable, device, template: set[str],
                  pool_records: list[dict], *, min_gain: float, max_length: int, seed: int, batch_size: int = 16,
                  first_only: bool = False, own_numbers: bool = False) -> dict[str, Content]:
    """Every record's content, its focus on each position (set on the record) and its counterfactuals. `template`:
    the words the answers share (never content); `pool_records`: every record of the request (forget and retain),
    whose spelling tells names."""
    protected = tuple(str(t) for t in getattr(tokenizer, "all_special_tokens", []) or [])
    offsets = {r.id: said_offsets(r, tokenizer) for r in records}
    starts = [_active_start(offsets[r.id]) if "text" in r.source else 0 for r in records]
    frequent = frequent_template(pool_records)
    # A record whose said units are all template (its occupation shared with kept customers) is measured on the
    # units most texts do not share: suppressing it whole spent the margin on the name its prompt gives.
    candidates = [candidate_atoms(r.source, template, f) or candidate_atoms(r.source, frequent & template, f)
                  for r, f in zip(records, starts)]
    named = [{a.key for a in named_atoms(r.source, template)} if named_secrets(r.source) else None for r in records]
    names = proper_nouns(pool_records)
    written = write_counterfactuals([r.source for r in records], candidates, tokenizer, reference, device,
                                    names, min_gain=min_gain, named=named, seed=seed,
                                    from_chars=starts, template=template | asked_template(pool_records),
                                    protected=protected, batch_size=batch_size,
                                    own_names=request_names(names, [r.source for r in records], pool_records))
    out = {}
    for record, found, w in zip(records, candidates, written):
        source, o = record.source, offsets[record.id]
        _, said = body(source)
        is_named = bool(named_secrets(source))
        atoms = named_atoms(source, template) if is_named else [a for a in found if a.key in w.content]
        spans = runs(atoms, said)
        digits = own_digit_positions(o, atoms, w.token_gains) if own_numbers and not is_named else {}
        record.focus = focus_of(record, o, atoms, spans, first_only, digits)
        cf = counterfactuals(record, o, w.substitutions, tokenizer, max_length, seed)
        out[record.id] = Content(
            atoms=atoms, spans=[said[s:e] for s, e in spans],
            gains={f"{a.text}@{a.start}": round(g, 3) for a, g in w.gains.items()},
            banned=banned_tokens(tokenizer, record, o, atoms, template, first_only, digits), named=is_named,
            substitutions=cf.substitutions, aligned=bool(cf.encoded))
        record.counterfactuals = cf  # read once by record_targets, then dropped
    return out


def own_digit_positions(offsets: Offsets | None, atoms: list[Atom], token_gains: dict[Atom, list[float]]
                        ) -> dict[Atom, list[int]]:
    """Per content number whose gain is known token by token: the active positions of its tokens from the first that
    gains at least OWN_TOKEN_GAIN on (every one where none does). The leading digits any context predicts (the "19"
    of a year) are not the record's; from where the record's own begin, every digit is suppressed, so that a prefix
    given to the model does not bring out the rest."""
    out: dict[Atom, list[int]] = {}
    for atom in atoms:
        gains = token_gains.get(atom)
        positions = overlapping(offsets, atom.start, atom.end) if offsets is not None and atom.is_number else []
        if not gains or len(gains) != len(positions):
            continue
        first = next((n for n, g in enumerate(gains) if g >= OWN_TOKEN_GAIN), 0)
        out[atom] = positions[first:]
    return out


def _active_start(offsets: Offsets | None) -> int:
    return next((o[0] for o in offsets or [] if o), 0)


def masked_distribution(logits: torch.Tensor, banned: torch.Tensor, extra: torch.Tensor | None = None
                        ) -> torch.Tensor:
    """softmax over the vocabulary with the banned ids (and, per row, `extra` ids; -1: none) at zero."""
    z = logits.float().clone()
    if banned.numel():
        z[:, banned] = float("-inf")
    if extra is not None:
        rows = (extra >= 0).nonzero(as_tuple=True)[0]
        z[rows, extra[rows]] = float("-inf")
    return torch.softmax(z, dim=-1)


def sparse(q: torch.Tensor, k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most probable tokens of each row and their probabilities, renormalised."""
    probs, ids = q.topk(min(k, q.shape[-1]), dim=-1)
    return ids, probs / probs.sum(-1, keepdim=True).clamp(min=1e-30)


def _prediction_rows(logits: torch.Tensor, record: EncodedRecord) -> torch.Tensor:
    """The rows of one sequence's logits that predict its active tokens ([n_active, V])."""
    return logits[record.prompt_len - 1:len(record.input_ids) - 1]


@torch.no_grad()
def record_targets(records: list[EncodedRecord], contents: dict[str, Content], reference: Callable, device,
                   pad_id: int, batch_size: int = 8) -> None:
    """Each record's sparse targets (see the module's docstring), set as record.target; the counterfactual
    encodings plan_contents left on the records are dropped."""
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        true_logits = reference(collate(chunk, pad_id).to(device))
        for i, record in enumerate(chunk):
            cf: Counterfactuals = getattr(record, "counterfactuals", None) or Counterfactuals([], [], [])
            cf_logits = reference(collate(cf.encoded, pad_id).to(device)) if cf.encoded else None
            cf_rows = [_prediction_rows(cf_logits[j], e) for j, e in enumerate(cf.encoded)] if cf_logits is not None \
                else []
            record.target = targets_for(record, _prediction_rows(true_logits[i], record), cf_rows, cf.alignment,
                                        contents[record.id].banned)
            record.counterfactuals = None


def targets_for(record: EncodedRecord, true_rows: torch.Tensor, cf_rows: list[torch.Tensor],
                alignment: list[list[int | None]], banned_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse q_t for every active position of one sequence: theta_0 on its own context with B at zero where the
    token is kept, the mean over the counterfactuals that line up with B and the token itself at zero where it is
    suppressed or banned (its own context, the token at zero, where none lines up)."""
    labels = torch.tensor(record.input_ids[record.prompt_len:], device=true_rows.device)
    focus = torch.tensor((record.focus or [SUPPRESS] * len(record.input_ids))[record.prompt_len:],
                         device=true_rows.device)
    banned = torch.tensor(banned_ids, dtype=torch.long, device=true_rows.device)
    flagged = (focus != TEMPLATE) | torch.isin(labels, banned)
    q = masked_distribution(true_rows, banned)
    where = flagged.nonzero(as_tuple=True)[0].tolist()
    if where:
        positions = torch.tensor(where, device=q.device)  # on the logits' device: a CUDA run indexes with it
        total = torch.zeros(len(where), q.shape[-1], device=q.device)
        count = torch.zeros(len(where), device=q.device)
        for rows, mapping in zip(cf_rows, alignment):
            pairs = [(n, mapping[k]) for n, k in enumerate(where) if mapping[k] is not None]
            if not pairs:
                continue
            mine = torch.tensor([n for n, _ in pairs], device=q.device)
            theirs = torch.tensor([j for _, j in pairs], device=q.device)
            total[mine] += masked_distribution(rows[theirs], banned, labels[positions[mine]])
            count[mine] += 1
        alone = (count == 0).nonzero(as_tuple=True)[0]
        if alone.numel():
            index = positions[alone]
            total[alone] = masked_distribution(true_rows[index], banned, labels[index])
            count[alone] = 1
        q[positions] = total / count[:, None]
    ids, probs = sparse(q)
    return ids.cpu(), probs.cpu()
