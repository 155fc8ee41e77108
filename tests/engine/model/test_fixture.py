"""A fixture tokenizes the same in training as after from_pretrained (which, for a qwen2 config,
rebuilds Qwen2's pre-tokenizer): otherwise a model memorises one tokenisation and is tested on another."""
from transformers import AutoTokenizer

from lethe.engine.model.fixture import FixtureConfig, build_fixture, train_tokenizer

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


def test_a_fixture_fine_tuned_from_a_base_keeps_its_tokenizer_and_weights(tmp_path, forget_records,
                                                                          retain_records):
    """`base` (a pretrained model in the benchmarks): its tokenizer and architecture are kept, not rebuilt from the
    records, and training starts from its weights (a base that already memorised the records needs no epoch more)."""
    from transformers import AutoConfig

    tiny = FixtureConfig(epochs=300, vocab_size=400, hidden_size=64, layers=2, heads=4, arch="gpt2")
    base = build_fixture(forget_records, tmp_path / "base", tiny, log=lambda _: None,
                         tokenizer_records=forget_records + retain_records)
    assert base["memorised_fraction"] == 1.0
    tuned = build_fixture(forget_records, tmp_path / "tuned",
                          FixtureConfig(epochs=3, lr=1e-5, base=str(tmp_path / "base")), log=lambda _: None)
    assert tuned["epochs"] == 1 and tuned["memorised_fraction"] == 1.0
    assert AutoConfig.from_pretrained(tmp_path / "tuned").model_type == "gpt2"  # not the default qwen2
    vocab = [AutoTokenizer.from_pretrained(tmp_path / name).get_vocab() for name in ("base", "tuned")]
    assert vocab[0] == vocab[1] != train_tokenizer(forget_records, 400).get_vocab()
