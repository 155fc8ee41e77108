"""`python -m bench.bench_chain --from-root`: the version measured after request n is the root's weights plus every
run's change, checked weight by weight against the sum written out by hand on tiny models."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from bench.bench_chain import composed
from lethe.engine.model.fixture import train_tokenizer


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_composed_version_is_the_root_plus_each_runs_change(tmp_path):
    tokenizer = train_tokenizer([{"prompt": "Question: who? Answer: ", "completion": "Ines Okafor, 12."}], 64)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=16, n_embd=8, n_layer=1, n_head=2)
    torch.manual_seed(0)
    root = GPT2LMHeadModel(config)
    runs = []
    for seed in (1, 2):
        run = GPT2LMHeadModel(config)
        run.load_state_dict(root.state_dict())
        with torch.no_grad():
            for p in run.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
        runs.append(_save(run, tokenizer, tmp_path / f"run{seed}"))
    _save(root, tokenizer, tmp_path / "root")
    composed(tmp_path / "root", runs, tmp_path / "sum")

    out = GPT2LMHeadModel.from_pretrained(tmp_path / "sum").state_dict()
    one, two = (GPT2LMHeadModel.from_pretrained(r).state_dict() for r in runs)
    for name, weight in root.state_dict().items():
        if weight.is_floating_point():
            assert torch.allclose(out[name], weight + (one[name] - weight) + (two[name] - weight), atol=1e-5), name
    assert not torch.allclose(out["transformer.h.0.mlp.c_fc.weight"], one["transformer.h.0.mlp.c_fc.weight"])
