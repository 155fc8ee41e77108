"""Loading any causal LM, the trainable policy (LoRA or full), its frozen reference pi_0, saving."""
from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from worker.engine.errors import EngineInputError


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise EngineInputError(f"device {name!r}: expected cpu or cuda", field="device")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise EngineInputError(f"device {name!r}: CUDA is not available on this machine", field="device")
    return torch.device(name)


def autocast(device: torch.device):
    """bf16 autocast on CUDA (weights stay fp32 for the optimiser); nothing on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def load_model(source: str | os.PathLike, device: torch.device):
    """A model and tokenizer through from_pretrained: a local directory, or a hub id where a network exists."""
    source = str(source)
    hf_logging.disable_progress_bar()  # callers show their own progress; stderr stays for errors
    looks_local = source.startswith((".", "/", "~")) or Path(source).exists()
    if looks_local:
        if not Path(source).expanduser().is_dir():
            raise EngineInputError(f"model {source!r}: no such directory", field="model")
        source = str(Path(source).expanduser())
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise EngineInputError(f"model {source!r}: cannot be loaded ({str(exc).splitlines()[0]})",
                               field="model") from None
    if tokenizer.eos_token_id is None:
        raise EngineInputError(f"model {source!r}: the tokenizer has no EOS token", field="model")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked everywhere, so any id will do
    # Dropout stays off throughout: pi_0 must be exact and the stop rule's V deterministic.
    model.to(device).eval()
    return model, tokenizer


def context_length(model, tokenizer, requested: int = 0) -> int:
    limits = [n for n in (getattr(model.config, "max_position_embeddings", 0), requested) if n]
    return min(limits) if limits else 2048


class Policy:
    """The model being unlearned, and pi_0: adapters disabled (LoRA) or a frozen copy (full)."""

    def __init__(self, model, *, lora: bool, r: int = 16, alpha: int = 32, dropout: float = 0.0,
                 targets: list[str] | None = None):
        self.lora = lora
        if lora:
            from peft import LoraConfig, get_peft_model

            names = [name for name, _ in model.named_modules()]
            missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
            if missing:
                raise EngineInputError(f"lora_targets: the model has no modules named {missing}",
                                       field="lora_targets")
            config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                                bias="none", task_type="CAUSAL_LM")
            self.model = get_peft_model(model, config)
            self.frozen = None
        else:
            self.model = model
            self.frozen = copy.deepcopy(model).requires_grad_(False).eval()
        self.model.eval()

    def restrict_training(self, module_suffixes: list[str]) -> None:
        """Full mode: train only the named modules (RMU updates a few MLP projections)."""
        keep = {n for n, _ in self.model.named_modules() if any(n.endswith(s) for s in module_suffixes)}
        for name, parameter in self.model.named_parameters():
            parameter.requires_grad_(name.rsplit(".", 1)[0] in keep)

    def outputs(self, batch):
        return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)

    @torch.no_grad()
    def reference_outputs(self, batch):
        return self._reference(batch, output_hidden_states=True)

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def logits(self, batch) -> torch.Tensor:
        return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits

    @torch.no_grad()
    def reference_logits(self, batch) -> torch.Tensor:
        """pi_0's logits on a batch."""
        return self._reference(batch).logits

    def _reference(self, batch, **kwargs):
        """pi_0's forward pass: adapters disabled (LoRA) or the frozen copy (full)."""
        kwargs.update(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        if self.lora:
            with self.model.disable_adapter():
                return self.model(**kwargs)
        return self.frozen(**kwargs)

    def merged(self):
        """The plain transformers model with any LoRA update merged in (the policy is spent after)."""
        self.frozen = None
        return self.model.merge_and_unload() if self.lora else self.model


def save_model(model, tokenizer, directory: Path) -> None:
    """save_pretrained as safetensors with the tokenizer: loadable by from_pretrained, no peft needed."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="2GB")
    tokenizer.save_pretrained(directory)
