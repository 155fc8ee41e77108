"""How surely each version still says one mini-TOFU record, teacher-forced: the mean log-probability of its
completion and the probability of the first token of a word in it (a secret), read on each version named. A record
that later requests bring back shows it here before its greedy answer does (BENCHMARKS.md, "Which rows the anchor
pulls").

    python -m bench.record_probability tofu-3622 Waiter bench/.fixtures/chainL/v2 bench/.fixtures/chainL/v3"""
from __future__ import annotations

import argparse
import json

import torch

from bench.mini_tofu import tofu_records


def read(version: str, record: dict, word: str) -> dict:
    """The completion's mean log-probability after the prompt, and P(the first token of `word` | what precedes it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(version)
    model = AutoModelForCausalLM.from_pretrained(version).eval()
    start = record["completion"].index(word)
    # Prompt and completion tokenised apart, as the engine encodes a record.
    prompt = tokenizer(record["prompt"], add_special_tokens=False).input_ids
    completion = tokenizer(record["completion"], add_special_tokens=False).input_ids
    ids = prompt + completion
    with torch.no_grad():
        log_p = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    said = log_p[torch.arange(len(prompt) - 1, len(ids) - 1), torch.tensor(completion)]
    # The word's first token: the first completion token whose text reaches past the word's first character.
    first = next(k for k in range(len(completion)) if len(tokenizer.decode(completion[:k + 1])) > start)
    return {"version": version, "completion_mean_log_p": round(said.mean().item(), 3),
            "word_token": tokenizer.decode([completion[first]]),
            "word_first_token_p": float(f"{said[first].exp().item():.4g}")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.record_probability")
    parser.add_argument("record", help="a mini-TOFU record id (tofu-3600 ... tofu-3999)")
    parser.add_argument("word", help="a word of its completion")
    parser.add_argument("versions", nargs="+", help="model folders")
    args = parser.parse_args(argv)
    record = next(r for r in tofu_records(range(180, 200)) if r["id"] == args.record)
    for version in args.versions:
        print(json.dumps(read(version, record, args.word)), flush=True)


if __name__ == "__main__":
    main()
