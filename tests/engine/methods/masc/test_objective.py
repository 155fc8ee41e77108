"""The retain term's masking, and pi_0 under LoRA (adapters disabled) and full fine-tuning (frozen copy)."""
import torch
import torch.nn.functional as F

from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.records import IGNORE, collate, encode_records
from lethe.engine.methods.masc import margin as M
from lethe.engine.model.loading import TrainableModel, load_model


def test_kl_matches_brute_force_and_ignores_prompt_and_padding():
    g = torch.Generator().manual_seed(0)
    policy = torch.randn(2, 6, 7, generator=g, dtype=torch.float64)
    ref = torch.randn(2, 6, 7, generator=g, dtype=torch.float64)
    labels = torch.tensor([[IGNORE, IGNORE, 3, 4, 1, IGNORE], [IGNORE, 2, 2, 5, 6, 0]])
    z, _, _ = M.active_positions(policy, labels)
    z0, _, _ = M.active_positions(ref, labels)
    kl = M.masked_kl(z0, z)
    terms = []
    for b in range(2):
        for t in range(5):
            if labels[b, t + 1] != IGNORE:
                p0 = F.softmax(ref[b, t], -1)
                p = F.softmax(policy[b, t], -1)
                terms.append(sum(p0[v] * (p0[v].log() - p[v].log()) for v in range(7)).item())
    assert abs(kl.item() - sum(terms) / len(terms)) < 1e-5
    # Changing logits where the next token is prompt or padding changes nothing.
    inactive = torch.ones(2, 6, dtype=torch.bool)
    inactive[:, :-1] = labels[:, 1:] == IGNORE
    noisy_policy = torch.where(inactive[..., None],
                               policy + 5 * torch.randn(policy.shape, generator=g, dtype=policy.dtype), policy)
    noisy_ref = torch.where(inactive[..., None], torch.randn(ref.shape, generator=g, dtype=ref.dtype), ref)
    z_n, _, _ = M.active_positions(noisy_policy, labels)
    z0_n, _, _ = M.active_positions(noisy_ref, labels)
    assert M.masked_kl(z0_n, z_n).item() == kl.item()
    assert not torch.equal(noisy_policy, policy)


def _retain_batch(tokenizer, records):
    enc = encode_records(normalise_records(records, "retain"), tokenizer, max_length=512, seed=0, what="retain")
    return collate(enc, tokenizer.pad_token_id)


def _train_a_few_steps(policy, batch, steps=3, lr=1e-2):
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr)
    for _ in range(steps):
        z, y, _ = M.active_positions(policy.logits(batch), batch.labels)
        loss = -M.token_nll(z, y)  # any update that moves the policy
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_lora_reference_equals_original_model_before_and_after_steps(fixture_model, retain_records):
    original, tokenizer = load_model(fixture_model, torch.device("cpu"))
    batch = _retain_batch(tokenizer, retain_records[:6])
    with torch.no_grad():
        expected = original(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.clone()
    model, _ = load_model(fixture_model, torch.device("cpu"))
    policy = TrainableModel(model, lora=True, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    assert torch.equal(policy.reference_logits(batch), expected)
    total = sum(p.numel() for p in policy.model.parameters())
    assert 0 < sum(p.numel() for p in policy.trainable_parameters()) < total / 2  # adapters only
    _train_a_few_steps(policy, batch)
    with torch.no_grad():
        moved = policy.logits(batch)
    assert (moved - expected).abs().max() > 1e-3  # the policy did move
    assert torch.equal(policy.reference_logits(batch), expected)  # pi_0 did not
    assert policy.frozen is None  # no second copy of the weights


def test_full_mode_reference_is_a_frozen_copy(fixture_model, retain_records):
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    batch = _retain_batch(tokenizer, retain_records[:4])
    with torch.no_grad():
        expected = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.clone()
    policy = TrainableModel(model, lora=False)
    assert sum(p.numel() for p in policy.trainable_parameters()) == sum(p.numel() for p in model.parameters())
    _train_a_few_steps(policy, batch)
    with torch.no_grad():
        assert (policy.logits(batch) - expected).abs().max() > 1e-3
    assert torch.equal(policy.reference_logits(batch), expected)
