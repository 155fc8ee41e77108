"""A scripted model for the stop rule's tests (issue 24): a bigram table whose greedy path from a prompt is written by
hand, so that every teacher-forced condition holds while the answer loops, leaks, or the merged copy reproduces the
record; and the rule's own confirm and with_answers around it, with no training."""
import types

import torch

from lethe.engine.data.records import SECRET, TEMPLATE
from lethe.engine.methods.masc.answers import Answering
from lethe.engine.methods.masc.content import Atom
from lethe.engine.methods.masc.destination import Content
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.methods.masc.replay import Replays
from lethe.engine.methods.masc.stop_policy import MascStopPolicy
from lethe.engine.methods.masc.stop_rule import ErasureCondition, OnlineStopRule, RecordCheck, RecordStates

RECORD = {"id": "p0-0", "prompt": "Question: Where was Nelvorbax born?\nAnswer: ",
          "completion": "Nelvorbax was born in Tallinn.", "secrets": ["Tallinn"]}


class BigramLM(torch.nn.Module):
    """Next-token logits that depend on the last token only; `generate` decodes greedily as transformers does."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)

    def next_logits(self, last: torch.Tensor) -> torch.Tensor:
        return self.table[last]

    def forward(self, input_ids, attention_mask=None, use_cache=False, **_):
        return types.SimpleNamespace(logits=self.next_logits(input_ids))

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, eos_token_id=None, do_sample=False,
                 num_return_sequences=1, **_):
        ids = input_ids.repeat_interleave(num_return_sequences, dim=0)
        for _ in range(max_new_tokens):
            logits = self.next_logits(ids[:, -1])
            chosen = torch.multinomial(logits.softmax(-1), 1) if do_sample else logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, chosen], dim=1)
        return ids


LEAD = 30.0  # a scripted successor's logit: every other token together keeps under 1e-9 of a sample


def scripted(tokenizer, record, answer: list[int]) -> BigramLM:
    """A model under which no token of the record is the argmax given the one before it (every teacher-forced
    condition holds), and whose greedy answer to the prompt is `answer` (and, but for 1e-9, every sample)."""
    vocab = len(tokenizer)
    table = torch.zeros(vocab, vocab)
    ids = record.input_ids
    elsewhere = tokenizer(" amber", add_special_tokens=False)["input_ids"][0]
    for a in ids[:-1]:
        table[a, elsewhere] = LEAD  # after every token of the record, something else leads
    path = [ids[record.prompt_len - 1], *answer, tokenizer.eos_token_id]
    written = set()
    for a, b in zip(path, path[1:]):
        if a not in written:  # a token's first successor on the path is its successor: a path can close a loop
            written.add(a)
            table[a] = 0
            table[a, b] = LEAD
    table[tokenizer.eos_token_id, tokenizer.eos_token_id] = LEAD
    return BigramLM(table)


def tokens(tokenizer, words: list[str]) -> list[int]:
    return [t for w in words for t in tokenizer(w, add_special_tokens=False)["input_ids"]]


def named_content(record, secret: str, substitutions: list | None = None) -> Content:
    """The record's content as a request naming `secret` would give it: the one span where its answer says it."""
    start = record.source["completion"].index(secret)
    return Content([Atom(start, start + len(secret), secret)], [secret], {}, [], named=True,
                   substitutions=substitutions or [])


def rule_over(tokenizer, record, model: BigramLM, served: BigramLM | None = None,
              params: MascParams | None = None, secret: str = "Tallinn",
              others: list | None = None, substitutions: list | None = None) -> MascStopPolicy:
    """The rule's own confirm and with_answers, around a scripted policy (no training happens); `others`: more forget
    records, (record, Content) pairs, whose content answers are held to, outside the records the rule checks."""
    content = named_content(record, secret, substitutions)
    record.focus = [TEMPLATE] * len(record.input_ids)
    for k in range(record.prompt_len, len(record.input_ids)):
        piece = tokenizer.decode([record.input_ids[k]]).strip()
        if piece and piece in secret:
            record.focus[k] = SECRET
    trainable = types.SimpleNamespace(model=model, sharded=False, logits=lambda b: model(b.input_ids).logits,
                                   reference_logits=lambda b: model(b.input_ids).logits,
                                   merged_copy=lambda dtype: served or model)
    masc = Masc((params or MascParams()).resolved(), trainable, tokenizer.pad_token_id)
    masc.eos_id = tokenizer.eos_token_id
    rule = MascStopPolicy.__new__(MascStopPolicy)
    rule.params, rule.objective, rule.trainable = masc.params, masc, trainable
    rule.train_mode, rule.by_record, rule.confirm_set = True, {record.id: record}, [record]
    others = others or {}
    answering = Answering([record, *(r for r, _ in others)], {record.id: content, **{r.id: c for r, c in others}},
                          tokenizer, 64)
    rule.replays = Replays(answering, trainable.reference_logits, torch.device("cpu"), 0)
    rule.replays.base_loops = set()  # theta_0's own answers (start() asks them first) did not loop
    rule.erasure = ErasureCondition({record.id: 1.0}, 0.01, frozenset({record.id}))
    rule.rule = OnlineStopRule(0.5, 1, condition=rule.erasure)
    rule.run = types.SimpleNamespace(saved_dtype=torch.float32)
    rule.served, rule.served_checks, rule.sample_checks, rule.answered_at = None, [], [], {}
    rule.latest = RecordStates([RecordCheck(record.id, 0.0, 5, False)])
    return rule

