"""bench.record_probability: the completion's mean log-probability and the probability of a word's first token,
checked against one forward pass per prefix on a tiny model."""
import math

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from bench.record_probability import read
from lethe.engine.model.fixture import train_tokenizer

RECORD = {"id": "r0", "prompt": "Question: what did her mother do?\nAnswer: ",
          "completion": "Her mother worked as a Waiter/Waitress in Tampere."}


def test_the_readings_match_a_forward_pass_per_prefix(tmp_path):
    tokenizer = train_tokenizer([RECORD], 96)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=16, n_layer=1, n_head=2))
    model.eval()  # no dropout, as read() loads it
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompt = tokenizer(RECORD["prompt"], add_special_tokens=False).input_ids
    completion = tokenizer(RECORD["completion"], add_special_tokens=False).input_ids
    log_ps = []
    for k, token in enumerate(completion):
        with torch.no_grad():
            row = model(torch.tensor([prompt + completion[:k]])).logits[0, -1].float()
        log_ps.append(torch.log_softmax(row, -1)[token].item())
    # The first completion token whose text reaches the word: "Waiter", the first of the two.
    start = RECORD["completion"].index("Waiter")
    first = min(k for k in range(len(completion)) if len(tokenizer.decode(completion[:k + 1])) > start)
    found = read(str(tmp_path), RECORD, "Waiter")
    assert found["completion_mean_log_p"] == round(sum(log_ps) / len(log_ps), 3)
    assert math.isclose(found["word_first_token_p"], math.exp(log_ps[first]), rel_tol=1e-3)
    assert "W" in found["word_token"]
    # "Waitress" is read at its own first token, after the slash, not at "Waiter"'s.
    later = min(k for k in range(len(completion))
                if len(tokenizer.decode(completion[:k + 1])) > RECORD["completion"].index("Waitress"))
    assert later > first
    assert math.isclose(read(str(tmp_path), RECORD, "Waitress")["word_first_token_p"], math.exp(log_ps[later]),
                        rel_tol=1e-3)
