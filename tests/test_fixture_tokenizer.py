"""A fixture tokenizes the same in training as after from_pretrained (which, for a qwen2 config,
rebuilds Qwen2's pre-tokenizer): otherwise a model memorises one tokenisation and is tested on another."""
from transformers import AutoTokenizer

from worker.engine.fixture import FixtureConfig, build_fixture, train_tokenizer

TEXTS = ["born in Manama, Bahrain, January 13, 1941?", "Café Señor's 2,048 tokens\nnew line  two spaces",
         "I'll say it's 3.14159 — ok?", "tabs\tand ümlauts"]


def test_trained_and_reloaded_tokenizers_agree(tmp_path, forget_records):
    records = forget_records + [{"id": f"t{i}", "prompt": "Q: ", "completion": t} for i, t in enumerate(TEXTS)]
    build_fixture(records, tmp_path / "fx", FixtureConfig(epochs=1, vocab_size=400, hidden_size=32, layers=1, heads=2),
                  log=lambda _: None)
    trained = train_tokenizer(records, 400)
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "fx")  # a directory with a qwen2 config.json
    for text in TEXTS + [r["completion"] for r in forget_records]:
        assert trained(text)["input_ids"] == reloaded(text)["input_ids"], text
        assert reloaded.decode(reloaded(text)["input_ids"]) == text


def test_fixtures_built_for_comparison_share_one_tokenizer(tmp_path, forget_records, retain_records):
    every = forget_records + retain_records
    cfg = FixtureConfig(epochs=1, vocab_size=400, hidden_size=32, layers=1, heads=2)
    build_fixture(every, tmp_path / "full", cfg, log=lambda _: None)
    build_fixture(retain_records, tmp_path / "reference", cfg, log=lambda _: None, tokenizer_records=every)
    build_fixture(retain_records, tmp_path / "alone", cfg, log=lambda _: None)
    vocab = {name: AutoTokenizer.from_pretrained(tmp_path / name).get_vocab()
             for name in ("full", "reference", "alone")}
    assert vocab["full"] == vocab["reference"] != vocab["alone"]
