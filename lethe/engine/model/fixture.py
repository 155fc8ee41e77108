"""Fixture models (SPEC section 10): a small causal LM (Qwen2 by default, any family of the installed
transformers with `arch`) with a byte-level BPE tokenizer trained on the given records, trained until
it has memorised their completions, saved with save_pretrained so that it loads through the same path
as any Hugging Face model."""
from __future__ import annotations

import contextlib
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import batches, collate, encode_records
from lethe.engine.methods.masc.margin import active_positions, token_nll
from lethe.engine.model.architectures import Size, tiny_config
from lethe.engine.model.loading import load_model
from lethe.engine.training.runtime import seed_everything

EOS = "<|endoftext|>"
# Qwen2's pre-tokenisation (digits one by one, NFC). transformers 5 loads a directory whose config says
# qwen2 with its Qwen2Tokenizer, which rebuilds exactly this pipeline: a fixture trained with another
# one would be tokenised differently after reloading than it was in training.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Families whose released tokenizers keep digit runs together (GPT-2's byte-level split); the others
# split digits one by one as Qwen2 and Llama do. Fixtures of each kind give the engine both data shapes.
GPT2_SPLIT_FAMILIES = {"gpt2", "gpt_neox", "gptj", "opt", "falcon", "bloom", "phi", "codegen", "gpt_neo", "gpt_bigcode"}
TEXT_FIELDS = ("prompt", "completion", "text", "paraphrased_prompt", "paraphrased_completion")


@dataclass
class FixtureConfig:
    seed: int = 0
    epochs: int = 60  # an upper limit: training stops once every record is memorised
    vocab_size: int = 2048
    hidden_size: int = 256
    layers: int = 4
    heads: int = 4
    context: int = 512
    lr: float = 2e-3
    batch_size: int = 16
    arch: str = "qwen2"  # any causal-LM model type of the installed transformers
    split: str = "auto"  # pre-tokenisation: "digits" (Qwen2's), "gpt2" (digit runs kept), "auto" by arch
    device: str = "cpu"  # "cuda": trained on the GPU, under bfloat16 autocast (bench.bench_gpu)
    intermediate_size: int = 0  # 0: the architecture's default for the hidden size
    max_seconds: float = 0.0  # stop after the epoch that passes this (0: no limit); the summary says how far it got
    # A from_pretrained folder to fine-tune instead of a model built from scratch: its own tokenizer and weights are
    # kept, the size fields above are ignored (a pretrained base, issue 24).
    base: str = ""

    def pre_tokenisation(self) -> str:
        if self.split != "auto":
            return self.split
        return "gpt2" if self.arch in GPT2_SPLIT_FAMILIES else "digits"


def train_tokenizer(records: list[dict], vocab_size: int, split: str = "digits") -> PreTrainedTokenizerFast:
    texts = [r[f] for r in records for f in TEXT_FIELDS if isinstance(r.get(f), str)]
    texts += [t for r in records for t in r.get("perturbed_completions") or [] if isinstance(t, str)]
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    if split == "gpt2":  # GPT-2's own regex inside ByteLevel
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == "digits":
        bpe.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise EngineInputError(f"split {split!r}: expected digits, gpt2 or auto", field="split")
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=EOS)


def build_model(tokenizer, cfg: FixtureConfig):
    """A randomly initialised model of the family `cfg.arch`, sized by `cfg`."""
    size = Size(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, layers=cfg.layers, heads=cfg.heads,
                kv_heads=max(1, cfg.heads // 2), intermediate_size=cfg.intermediate_size or cfg.hidden_size * 3,
                context=cfg.context)
    try:
        config = tiny_config(cfg.arch, size, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    except ValueError as exc:
        raise EngineInputError(f"arch {cfg.arch!r}: {str(exc).splitlines()[0]}", field="arch") from None
    for name, value in config.to_dict().items():  # memorising is the point: no dropout (GPT-2's is 0.1)
        if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop")):
            setattr(config, name, 0.0)
    return AutoModelForCausalLM.from_config(config)


def build_fixture(records: list[dict], out: str | Path, cfg: FixtureConfig | None = None,
                  log=print, tokenizer_records: list[dict] | None = None) -> dict:
    """Train tokenizer and model on the records, save both to `out`; returns the fixture's summary.
    `tokenizer_records` (a superset) gives fixtures meant to be compared, such as a model and its
    retrain reference, one shared tokenizer."""
    cfg = cfg or FixtureConfig()
    records = normalise_records(records, "fixture")
    seed_everything(cfg.seed)
    started = time.perf_counter()
    device = torch.device(cfg.device)
    if cfg.base:
        model, tokenizer = load_model(cfg.base, device)
    else:
        tokenizer = train_tokenizer(normalise_records(tokenizer_records, "tokenizer") if tokenizer_records else records,
                                    cfg.vocab_size, cfg.pre_tokenisation())
        model = build_model(tokenizer, cfg).to(device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    encoded = encode_records(records, tokenizer, max_length=cfg.context, seed=cfg.seed, what="fixture")
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    # Warm up, then decay linearly to a tenth by the last allowed epoch: a fixed lr stalls short of
    # memorising every token.
    total_steps = cfg.epochs * -(-len(encoded) // cfg.batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / 20, 1.0 - 0.9 * min(1.0, s / total_steps)))
    rng = random.Random(cfg.seed)
    pad = tokenizer.pad_token_id
    model.train()
    epochs_run, memorised = 0, 0.0
    for epoch in range(1, cfg.epochs + 1):
        order = encoded[:]
        rng.shuffle(order)
        correct = total = 0
        for start in range(0, len(order), cfg.batch_size):
            batch = collate(order[start:start + cfg.batch_size], pad).to(device)
            with amp:
                logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
            z, y, _ = active_positions(logits, batch.labels)
            loss = token_nll(z, y)
            correct += (z.argmax(-1) == y).sum().item()
            total += y.numel()
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            schedule.step()
        epochs_run = epoch
        log(f"epoch {epoch}: loss {loss.item():.4f}, token accuracy {correct / total:.4f}")
        # Cheap check first (accuracy seen during the epoch), then the exact one.
        if correct == total:
            memorised = memorised_fraction(model, encoded, pad)
            if memorised == 1.0:
                break
        if cfg.max_seconds and time.perf_counter() - started > cfg.max_seconds:
            log(f"stopping after epoch {epoch}: max_seconds {cfg.max_seconds} passed")
            break
    model.eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # Measured on what from_pretrained gives back, tokenizer included: the figure users will see.
    reloaded, reloaded_tokenizer = load_model(out, device)
    memorised = memorised_fraction(reloaded, encode_records(records, reloaded_tokenizer, max_length=cfg.context,
                                                            seed=cfg.seed, what="fixture"), pad)
    summary = {"records": len(encoded), "epochs": epochs_run, "memorised_fraction": memorised,
               "parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer),
               "seconds": round(time.perf_counter() - started, 2), "config": asdict(cfg)}
    (out / "lethe_fixture.json").write_text(json.dumps(summary, indent=2))
    return summary


@torch.no_grad()
def memorised_fraction(model, encoded, pad: int) -> float:
    """Share of records whose every active token is the teacher-forced argmax: with greedy decoding
    that is exactly the share reproduced verbatim."""
    was_training = model.training
    model.eval()
    hits = 0
    device = next(model.parameters()).device
    for batch in batches(encoded, 32, pad):
        batch = batch.to(device)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        right = (logits[:, :-1].argmax(-1) == batch.labels[:, 1:]) | (batch.labels[:, 1:] < 0)
        hits += right.all(dim=1).sum().item()
    model.train(was_training)
    return hits / len(encoded)
