"""bench.utility_margins: each record's weakest answer-token margin, checked against a position-by-position loop over
one record at a time on a tiny model, and its summary's counts."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from bench.utility_margins import margin_summary, weakest_margins
from lethe.engine.data.records import encode_records
from lethe.engine.model.fixture import train_tokenizer

RECORDS = [{"id": f"r{i}", "prompt": f"Question: where is {town}?\nAnswer: ", "completion": answer}
           for i, (town, answer) in enumerate([("Tampere", "In Finland, by two lakes."), ("Oulu", "North."),
                                                ("Turku", "On the south-west coast of Finland, by the sea.")])]


def test_each_records_weakest_margin_is_the_smallest_over_its_answer_tokens():
    tokenizer = train_tokenizer(RECORDS, 96)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=16, n_layer=1, n_head=2))
    model.eval()
    encoded = encode_records(RECORDS, tokenizer, max_length=0, seed=0, what="retain")
    found = weakest_margins(model, encoded, tokenizer.pad_token_id, batch_size=2)  # padding in the first batch

    expected = []
    for record in encoded:
        with torch.no_grad():
            logits = model(torch.tensor([record.input_ids])).logits[0]
        margins = []
        for t in range(1, len(record.input_ids)):
            if record.labels[t] == -100:
                continue
            row = logits[t - 1].tolist()
            gold = row[record.labels[t]]
            margins.append(gold - max(v for j, v in enumerate(row) if j != record.labels[t]))
        expected.append(min(margins))
    assert len(found) == 3
    for got, want in zip(found, expected):
        assert abs(got - want) < 1e-4


def test_the_summary_counts_records_below_zero_and_below_two_logits():
    assert margin_summary([-1.0, 0.5, 3.0, 5.0]) == {"median": 1.75, "below_0": 1, "below_2": 2, "of": 4}
