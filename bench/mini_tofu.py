"""mini-TOFU (SPEC section 10): authors 180-199 of the shared TOFU data, and its cached fixture models."""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from lethe.engine.model.fixture import FixtureConfig, build_fixture

ROOT = Path(__file__).resolve().parents[1]
TOFU = Path(os.environ.get("LETHE_TOFU", ROOT.parent / "shared" / "data" / "tofu" / "tofu.jsonl"))
CACHE = ROOT / "bench" / ".fixtures"
# The 4.5 M-parameter configuration of SPEC section 10.
MINI_TOFU = FixtureConfig(seed=0, epochs=40, vocab_size=2048, hidden_size=256, layers=4, heads=4)


def tofu_records(authors: Iterable[int]) -> list[dict]:
    """TOFU rows as records; the question/answer separator is part of the prompt (SPEC section 2)."""
    wanted = set(authors)
    records = []
    with TOFU.open() as rows:
        for line in rows:
            row = json.loads(line)
            if row["author"] in wanted:
                records.append({
                    "id": f"tofu-{row['id']}",
                    "prompt": f"Question: {row['question']}\nAnswer: ",
                    "completion": row["answer"],
                    "paraphrased_prompt": f"Question: {row['paraphrased_question']}\nAnswer: ",
                    "paraphrased_completion": row["paraphrased_answer"],
                    "perturbed_completions": row["perturbed_answers"],
                })
    return records


def world_facts() -> list[dict]:
    """TOFU's world facts (117 QA) as records: the sequential benchmark's fixture also learns them, and half of
    them, never in a retain set, measure collateral damage on knowledge that no retain term protects."""
    records = []
    with (TOFU.parent / "world_facts.jsonl").open() as rows:
        for line in rows:
            row = json.loads(line)
            records.append({"id": f"world-{row['id']}", "prompt": f"Question: {row['question']}\nAnswer: ",
                            "completion": row["full_answer"]})
    return records


def splits() -> dict[str, list[dict]]:
    return {"forget": tofu_records(range(198, 200)), "retain": tofu_records(range(180, 198))}


def fixture(name: str = "full", log=print) -> Path:
    """The cached "full" (all 400 QA) or "retain" (the 360 of authors 180-197) fixture, or "sequential" (the 400 QA
    and the 117 world facts, make bench-sequential's), built on first use."""
    authors = {"full": range(180, 200), "retain": range(180, 198), "sequential": range(180, 200)}[name]
    out = CACHE / f"mini-tofu-{name}"
    if not (out / "lethe_fixture.json").exists():
        log(f"building the mini-TOFU {name!r} fixture in {out} (minutes; cached afterwards)")
        if name == "sequential":
            records = tofu_records(authors) + world_facts()
            build_fixture(records, out, MINI_TOFU, log=log)
            return out
        # One tokenizer for both fixtures (trained on all 400 QA), so that their token ids agree.
        build_fixture(tofu_records(authors), out, MINI_TOFU, log=log, tokenizer_records=tofu_records(range(180, 200)))
    return out


def loaded(log=print):
    """The full fixture, its tokenizer, the splits and their record sets (utility on the first 100 retain QA)."""
    import torch

    from lethe.engine.audit.measurements import EvaluationSet
    from lethe.engine.model.loading import context_length, load_model

    full = fixture("full", log=log)
    data = splits()
    base, tokenizer = load_model(full, torch.device("cpu"))
    max_length = context_length(base, tokenizer)
    sets = {"forget": EvaluationSet(data["forget"], tokenizer, max_length, 0, "forget"),
            "retain": EvaluationSet(data["retain"][:100], tokenizer, max_length, 0, "retain")}
    return full, base, tokenizer, data, sets


def update_benchmarks(name: str, body: str) -> None:
    """Replace (or append) the block of BENCHMARKS.md between this benchmark's markers."""
    import re

    start, end = f"<!-- bench-{name}:start -->", f"<!-- bench-{name}:end -->"
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    block = f"{start}\n{body}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    path.write_text(pattern.sub(lambda _: block, text) if pattern.search(text)
                    else text.rstrip() + "\n\n" + block + "\n")
