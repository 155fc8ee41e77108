"""Chat models (issue 14): a prompt/completion record rendered with the tokenizer's chat template as one user turn
and one assistant turn, so that an instruct model is unlearned on the format it answers in. Active tokens are the
assistant's turn as the template writes it (the answer and the template's end-of-turn marker); the prompt is the
conversation up to the assistant's turn (`add_generation_prompt`), so that generation from it answers the
question. Torch-free: the API checks a checkpoint's template from its files."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lethe.engine.contract.errors import EngineInputError

FORMATS = ("plain", "chat")
RENDERED = "_chat"  # set on a rendered record: its prompt holds the template's own special tokens, no EOS is added


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def checkpoint_has_chat_template(directory: Path) -> bool:
    """Whether a from_pretrained directory's tokenizer carries a chat template, read from its files."""
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    config = directory / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text()).get("chat_template")) if config.is_file() else False
    except (OSError, ValueError):
        return False


def check_format(value: str) -> str:
    if value not in FORMATS:
        raise EngineInputError(f"format {value!r}: must be \"plain\" or \"chat\"", field="format")
    return value


def render(records: list[dict], tokenizer: Any, format: str, what: str) -> list[dict]:
    """The records as the model sees them: unchanged in plain format; rendered with the chat template in chat
    format (every prompt-like and answer-like field, so that paraphrases and perturbed answers match)."""
    if check_format(format) == "plain" or not records:
        return records
    if not has_chat_template(tokenizer):
        raise EngineInputError("format chat: the model's tokenizer has no chat template (set one, or use the "
                               "plain format)", field="format")
    return [_rendered(r, tokenizer, what) for r in records]


def refuse_text(records: list[dict], what: str) -> None:
    """The chat format renders turns: a `text` record has none (checked here by the API too, without a tokenizer)."""
    if record := next((r for r in records if "text" in r), None):
        raise EngineInputError(f"{what} record {record['id']!r}: the chat format needs prompt and completion, not "
                               "text", field=what)


def _rendered(record: dict, tokenizer: Any, what: str) -> dict:
    refuse_text([record], what)
    prompt = record["prompt"]

    def question(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)

    asked = question(prompt)

    def answer(text: str) -> str:
        full = tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": text}], tokenize=False)
        if not full.startswith(asked):
            raise EngineInputError(f"{what} record {record['id']!r}: the chat template does not write the answer "
                                   "after the prompt it renders for generation", field="format")
        turn = full[len(asked):]
        # Generation stops at EOS: what a template writes after it (ChatML's "\n") can never be said, and would
        # keep every record from ever counting as reproduced.
        eos = getattr(tokenizer, "eos_token", None)
        return turn[:turn.index(eos) + len(eos)] if eos and eos in turn else turn

    out = {**record, "prompt": asked, "completion": answer(record["completion"]), RENDERED: True}
    if record.get("paraphrased_prompt"):
        out["paraphrased_prompt"] = question(record["paraphrased_prompt"])
    if record.get("paraphrased_completion"):
        out["paraphrased_completion"] = answer(record["paraphrased_completion"])
    if record.get("perturbed_completions"):
        out["perturbed_completions"] = [answer(p) for p in record["perturbed_completions"]]
    return out
