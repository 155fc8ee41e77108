"""What the own-text option (lethe.engine.methods.masc.own_text) would keep for request 1 of the chain: the texts a
version writes after the retain prompts' shared opening, how many were dropped as about the pair, the first few as
they read, and how many of the 57 unprotected world facts' answers (their first 25 characters) any kept text says.
Then the same for answers to a question the version never saw. One JSON line, then the texts.

    python -m bench.own_text_samples                          # the sequential fixture (the chain's root)
    python -m bench.own_text_samples --version DIR --samples 256"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from bench.bench_sequential import PAIRS, sequential_records
from bench.mini_tofu import fixture, tofu_records
from lethe.engine.data.records import encode_record
from lethe.engine.methods.masc.own_text import own_text
from lethe.engine.model.generation import continuations
from lethe.engine.model.loading import load_model

UNSEEN_QUESTION = "Question: What is the capital?\nAnswer: "


def echoed(texts: list[str], records: list[dict]) -> int:
    """How many records' answers (their first 25 characters) some text says."""
    return sum(any(r["completion"][:25] in t for t in texts) for r in records)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.own_text_samples")
    parser.add_argument("--version", type=Path, default=None, help="default: the sequential fixture")
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--show", type=int, default=6)
    args = parser.parse_args(argv)
    path = args.version or fixture("sequential", log=lambda line: print(line, file=sys.stderr))
    tofu, kept, utility_set = sequential_records()
    forget = tofu_records(range(PAIRS[0][0], PAIRS[0][1] + 1))
    retain = [r for r in tofu if r not in forget] + kept
    model, _ = load_model(path, torch.device("cpu"))
    tokenizer = AutoTokenizer.from_pretrained(path)

    def encoded(records: list[dict]) -> list:
        return [encode_record(r, tokenizer, max_length=256, seed=0) for r in records]

    rows, summary = own_text(model, tokenizer, encoded(forget), encoded(retain), samples=args.samples,
                             max_new_tokens=args.tokens, seed=0)
    texts = [tokenizer.decode(r.input_ids, skip_special_tokens=True) for r in rows]
    unseen = [tokenizer.decode(t, skip_special_tokens=True) for t in continuations(
        model, tokenizer, [tokenizer(UNSEEN_QUESTION)["input_ids"]] * args.samples, max_new_tokens=args.tokens,
        sample=True, seed=0)]
    print(json.dumps({**summary, "utility_answers_said": echoed(texts, utility_set),
                      "any_record_answer_said": echoed(texts, tofu + kept + utility_set),
                      "unseen_question": {"utility_answers_said": echoed(unseen, utility_set),
                                          "any_record_answer_said": echoed(unseen, tofu + kept + utility_set)}}))
    for text in texts[:args.show] + unseen[:args.show]:
        print(repr(text))


if __name__ == "__main__":
    main()
