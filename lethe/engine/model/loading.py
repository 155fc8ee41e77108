"""Loading any causal LM, the trainable model (LoRA or full), its frozen reference pi_0, saving."""
from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.pytorch_utils import Conv1D
from transformers.utils import logging as hf_logging

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.model_files import check_model_folder
from lethe.engine.model.lora_targets import ModuleInfo, Shape, block_index, resolve_targets, shape_from_config, suffixes


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


def local_source(source: str | os.PathLike) -> str:
    """A local directory as an absolute path (checked to exist, and its files to point nowhere else), or a hub id
    unchanged."""
    source = str(source)
    if is_local(source):
        if not Path(source).expanduser().is_dir():
            raise EngineInputError(f"model {source!r}: no such directory", field="model")
        source = str(Path(source).expanduser())
        check_model_folder(source)
    return source


def is_local(source: str) -> bool:
    return source.startswith((".", "/", "~")) or Path(source).exists()


def _fetch_options(source: str) -> dict:
    """A local folder is read from itself only: no Hub lookups on its behalf; no model's own code runs anywhere."""
    return {"trust_remote_code": False, **({"local_files_only": True} if is_local(source) else {})}


@contextlib.contextmanager
def loadable(source: str):
    """from_pretrained's failures (no such files, a broken config) as the engine's input error."""
    try:
        yield
    except (OSError, ValueError) as exc:
        raise EngineInputError(f"model {source!r}: cannot be loaded ({str(exc).splitlines()[0]})",
                               field="model") from None


def load_tokenizer(source: str | os.PathLike):
    """The tokenizer through from_pretrained, with an EOS token and a pad token."""
    source = local_source(source)
    with loadable(source):
        tokenizer = AutoTokenizer.from_pretrained(source, **_fetch_options(source))
    if tokenizer.eos_token_id is None:
        raise EngineInputError(f"model {source!r}: the tokenizer has no EOS token", field="model")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked everywhere, so any id will do
    return tokenizer


def load_weights(source: str | os.PathLike, device: torch.device, dtype: torch.dtype = torch.float32,
                 device_map: dict | None = None):
    """The model through from_pretrained, on `device` (or placed by `device_map` over several) in `dtype`, in eval
    mode."""
    source = local_source(source)
    hf_logging.disable_progress_bar()  # callers show their own progress; stderr stays for errors
    with loadable(source):
        placement = {"device_map": device_map} if device_map else {}
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **_fetch_options(source), **placement)
    if not device_map:
        model.to(device)  # type: ignore[arg-type]  # transformers types .to() for its own wrappers
    # Dropout stays off throughout: pi_0 must be exact and the stop rule's V deterministic.
    model.eval()
    return model


def load_model(source: str | os.PathLike, device: torch.device, dtype: torch.dtype = torch.float32):
    """A model and tokenizer through from_pretrained: a local directory, or a hub id where a network exists."""
    tokenizer = load_tokenizer(source)
    return load_weights(source, device, dtype), tokenizer


def load_config(source: str | os.PathLike):
    from transformers import AutoConfig

    source = local_source(source)
    with loadable(source):
        return AutoConfig.from_pretrained(source, **_fetch_options(source))


def context_length(model, tokenizer, requested: int = 0) -> int:
    return config_context_length(model.config, requested)


def config_context_length(config, requested: int = 0) -> int:
    limits = [n for n in (getattr(config, "max_position_embeddings", 0), requested) if n]
    return min(limits) if limits else 2048


def module_inventory(model) -> tuple[list[ModuleInfo], Shape]:
    """Every module of a live model with its kind and shape, and what the target rule needs to know."""
    modules = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            kind = "linear" if behaves_linear(module) else "other"
            modules.append(ModuleInfo(name, kind, module.in_features, module.out_features))
        elif isinstance(module, Conv1D):  # weight [in, out]
            modules.append(ModuleInfo(name, "conv1d", module.weight.shape[0], module.weight.shape[1]))
        elif isinstance(module, torch.nn.Embedding):
            modules.append(ModuleInfo(name, "embedding", module.num_embeddings, module.embedding_dim))
        elif name:
            modules.append(ModuleInfo(name, "other"))
    names = {id(module): name for name, module in model.named_modules()}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    shape = shape_from_config(model.config.to_dict())
    return modules, Shape(vocab_size=shape.vocab_size, expert_counts=shape.expert_counts,
                          output_head=names.get(id(head), "") if head is not None else "",
                          decoder_prefix=_decoder_prefix(model, names))


@torch.no_grad()
def behaves_linear(module: torch.nn.Linear) -> bool:
    """LoRA adds BAx to what the module returns, which is right only if it returns Wx + b. A subclass with
    its own forward is probed once (Falcon's FalconLinear passes; a grouped projection does not)."""
    if type(module).forward is torch.nn.Linear.forward:
        return True
    weight = module.weight
    if weight.is_meta:  # planning on the meta device: counted as linear (the estimate errs on the large side)
        return True
    probe = torch.randn(2, module.in_features, dtype=weight.dtype, device=weight.device,
                        generator=torch.Generator(device=weight.device).manual_seed(0))
    try:
        out = module(probe)
    except Exception:  # noqa: BLE001  it does not even take a plain input
        return False
    bias = module.bias.float() if module.bias is not None else None
    expected = torch.nn.functional.linear(probe.float(), weight.float(), bias)
    # Half precision rounds Wx and then Wx + b (bfloat16 on a GPU by default): a few of its ulps, relative to the
    # output's scale, are the same map; a grouped projection is off by the scale itself.
    tol = max(1e-3, 4 * torch.finfo(weight.dtype).eps)
    return (isinstance(out, torch.Tensor) and out.shape == expected.shape
            and torch.allclose(out.float(), expected, rtol=tol, atol=tol * float(expected.abs().max())))


def _decoder_prefix(model, names: dict) -> str:
    """Where the language model sits when a wrapper also holds other towers (vision, audio)."""
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError, ValueError):
        return ""
    if decoder is None or decoder is model or not any(block_index(n) is not None for n, _ in decoder.named_modules()):
        return ""  # no wrapper, or "decoder" names something else (ModernBERT's output projection)
    return names.get(id(decoder), "")


def lora_modules(model, requested) -> list[str]:
    """The full names of the modules LoRA adapts: found automatically ("auto") or as named. "auto" also
    leaves out what peft knows an architecture cannot take (Mamba's out_proj and conv1d)."""
    modules, shape = module_inventory(model)
    chosen = resolve_targets(requested, modules, shape)
    if requested == "auto":
        accepted = {suffix for suffix in suffixes(chosen) if _peft_accepts(model, suffix)}
        chosen = [n for n in chosen if n.rsplit(".", 1)[-1] in accepted]
    return chosen


def _peft_accepts(model, suffix: str) -> bool:
    try:  # peft's own per-architecture check (private, so guarded: without it every module is offered)
        from peft import LoraConfig
        from peft.tuners.tuners_utils import _check_lora_target_modules_mamba
    except ImportError:
        return True
    try:
        _check_lora_target_modules_mamba(LoraConfig(target_modules=[suffix]), model, suffix)
    except ValueError:
        return False
    return True


class TrainableModel:
    """The model being unlearned, and pi_0: adapters disabled (LoRA) or a frozen copy (full)."""

    def __init__(self, model, *, lora: bool, r: int = 16, alpha: int = 32, dropout: float = 0.0,
                 targets="auto", reference_dtype: torch.dtype | None = None):
        self.lora = lora
        # The retain term's reference when it is not pi_0 (issue 28): a fixed version of the lineage (its root, or a
        # pinned one), frozen, so that drift does not compound over sequential requests. None: pi_0.
        self.anchor: Any = None
        self.checkpointed: list = []
        self.sharded = False
        self.adapted: list[str] = []
        self.whitened: dict | None = None  # full mode with whiten_updates: what training.whitening set up
        # Run after every optimiser step, in place (training.erasure_guard's projections).
        self.constraints: list[Callable[[], None]] = []
        if lora:
            from peft import LoraConfig, get_peft_model

            self.adapted = lora_modules(model, targets)
            config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=self.adapted,
                                bias="none", task_type="CAUSAL_LM",
                                fan_in_fan_out=_mostly_conv1d(model, self.adapted))
            try:
                self.model = get_peft_model(model, config)
            except ValueError as exc:  # a named module LoRA cannot wrap (a container, say)
                raise EngineInputError(f"lora_targets: {str(exc).splitlines()[0]}", field="lora_targets") from None
            self.frozen = None
        else:
            self.model = model
            self.frozen = copy.deepcopy(model).requires_grad_(False).eval()
            if reference_dtype is not None:
                self.frozen.to(reference_dtype)  # only read: half precision holds it in half the memory
        self.model.eval()

    def shard(self, device: torch.device) -> None:
        """Full mode over several processes: FSDP on the trained model and on the frozen copy."""
        from lethe.engine.model import sharding

        sharding.shard(self.model, device)
        if self.frozen is not None:
            sharding.shard(self.frozen, device)
        self.sharded = True

    def checkpoint_activations(self) -> int:
        """Gradient checkpointing: each decoder block recomputes its activations in the backward pass."""
        from lethe.engine.model.checkpointing import checkpoint_blocks

        self.checkpointed = checkpoint_blocks(self.model)
        return len(self.checkpointed)

    def describe(self) -> dict:
        """What was adapted, for the result: module kinds by name and how many."""
        if not self.lora:
            return {"mode": "full", **({"whitened": self.whitened} if self.whitened else {})}
        return {"mode": "lora", "modules": suffixes(self.adapted), "count": len(self.adapted),
                "trainable_parameters": sum(p.numel() for p in self.trainable_parameters())}

    def restrict_training(self, module_suffixes: list[str]) -> None:
        """Full mode: train only the named modules (RMU updates a few MLP projections)."""
        keep = {n for n, _ in self.model.named_modules() if any(n.endswith(s) for s in module_suffixes)}
        for name, parameter in self.model.named_parameters():
            parameter.requires_grad_(name.rsplit(".", 1)[0] in keep)

    def after_step(self) -> None:
        """The constraints on the weights, once the optimiser has stepped."""
        for constraint in self.constraints:
            constraint()

    def outputs(self, batch):
        return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True,
                          use_cache=False)

    @torch.no_grad()
    def reference_outputs(self, batch):
        return self._reference(batch, output_hidden_states=True)

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def logits(self, batch) -> torch.Tensor:
        return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits

    @torch.no_grad()
    def reference_logits(self, batch) -> torch.Tensor:
        """pi_0's logits on a batch."""
        return self._reference(batch).logits

    @torch.no_grad()
    def anchor_logits(self, batch) -> torch.Tensor:
        """The retain term's reference on a batch: the anchor's logits, or pi_0's where the run has no anchor."""
        if self.anchor is None:
            return self.reference_logits(batch)
        return self.anchor(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits

    def _reference(self, batch, **kwargs):
        """pi_0's forward pass: adapters disabled (LoRA) or the frozen copy (full)."""
        kwargs.update(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        if self.lora:
            with self.model.disable_adapter():
                return self.model(**kwargs)
        if self.frozen is None:
            raise RuntimeError("the trainable model's frozen copy is gone: merged() was called")
        return self.frozen(**kwargs)

    def merged(self, dtype: torch.dtype | None = None):
        """The plain transformers model with any LoRA update merged in, in `dtype` (the checkpoint's own; None:
        as trained). The trainable model is spent after."""
        from lethe.engine.model.checkpointing import restore_blocks

        self.frozen = self.anchor = None
        restore_blocks(self.checkpointed)
        if self.sharded:
            from lethe.engine.model.sharding import gathered

            return gathered(self.model, dtype)  # rank 0's; None on the other processes
        return _merge(self.model, self.lora, dtype)

    @torch.no_grad()
    def merged_copy(self, dtype: torch.dtype | None = None):
        """What merged() would give, as a copy: training goes on unchanged (the stop rule checks the model as it
        will be saved before it lets the run stop). Holds a second copy of the weights while it lives."""
        if self.sharded:
            raise RuntimeError("a sharded trainable model is gathered only once, by merged()")
        twin = copy.deepcopy(self.model)
        if self.checkpointed:  # the copied wrappers would still call the original blocks
            from lethe.engine.model.checkpointing import restore_blocks

            names = {id(m): n for n, m in self.model.named_modules()}
            twins = dict(twin.named_modules())
            restore_blocks([twins[names[id(block)]] for block in self.checkpointed])
        return _merge(twin, self.lora, dtype).eval()


def _merge(model, lora: bool, dtype: torch.dtype | None):
    """A model with its LoRA update (if any) merged in, in `dtype`. A half-precision base is raised to float32 module
    by module before its update is added, so an update smaller than half precision's step is not rounded away
    before the sum is."""
    if not lora:
        return model.to(dtype) if dtype is not None else model
    if dtype is None or (dtype == torch.float32 and all(p.dtype == torch.float32 for p in model.parameters())):
        return model.merge_and_unload()  # float32 throughout: peft's own merge
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.get_base_layer().to(torch.float32)  # W + BA in float32, one rounding to dtype after
            module.merge()
    return model.unload().to(dtype)


def _mostly_conv1d(model, names: list[str]) -> bool:
    """Conv1D stores its weight transposed; peft corrects a wrong guess per module, with a warning."""
    kinds = dict(model.named_modules())
    return sum(isinstance(kinds[n], Conv1D) for n in names) * 2 > len(names)


def save_model(model, tokenizer, directory: Path) -> None:
    """save_pretrained as safetensors with the tokenizer: loadable by from_pretrained, no peft needed."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="2GB")
    tokenizer.save_pretrained(directory)
