"""The retain term's anchor (issue 28): a fixed version of the lineage whose predictions on the retain records the
run keeps, in place of the start model's, so that drift does not compound over sequential requests."""
import pytest
import torch

from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.inputs import RunInputs
from lethe.engine.data.records import collate, encode_records
from lethe.engine.methods.masc import margin as M
from lethe.engine.methods.masc.objective import Masc
from lethe.engine.methods.masc.params import MascParams
from lethe.engine.model.loading import TrainableModel, load_model, save_model
from lethe.engine.unlearn import unlearn

pytestmark = pytest.mark.slow  # loads and trains the fixture model


@pytest.fixture(scope="module")
def drifted(fixture_model, tmp_path_factory):
    """Another version of the same lineage: the fixture with its output layer moved."""
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.add_(0.05 * torch.randn(head.shape, generator=torch.Generator().manual_seed(0)))
    out = tmp_path_factory.mktemp("drifted") / "model"
    save_model(model, tokenizer, out)
    return out


def test_the_retain_term_measures_against_the_anchor(fixture_model, drifted, retain_records):
    model, tokenizer = load_model(fixture_model, torch.device("cpu"))
    anchor, _ = load_model(drifted, torch.device("cpu"))
    params = MascParams.from_dict({}).resolved()
    trainable = TrainableModel(model, lora=True, targets=["q_proj", "v_proj"])
    objective = Masc(params, trainable, tokenizer.pad_token_id)
    batch = collate(encode_records(normalise_records(retain_records[:6], "retain"), tokenizer, max_length=512, seed=0,
                                   what="retain"), tokenizer.pad_token_id)
    with torch.no_grad():
        logits = trainable.logits(batch)
        z, y, _ = M.active_positions(logits, batch.labels)
        # Without an anchor the reference is pi_0, which the policy is before any step: nothing to keep.
        assert objective._retain_term(logits, batch.labels, batch).item() == pytest.approx(0.0, abs=1e-6)
        trainable.anchor = anchor
        z_anchor, _, _ = M.active_positions(
            anchor(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch.labels)
        # The reference: where the start (pi_0, here the policy itself) gives a retain token less probability than
        # the anchor, the anchor's logit for it and the lower of the two for every other token; elsewhere the start's.
        reference = M.lineage_reference(z_anchor, z, y)
        assert not torch.allclose(reference, M.centred(z_anchor))  # the start's lower logits do count
        expected = M.masked_kl(reference, z) \
            + params.keep_weight * M.kept_argmax_hinge(z, reference, y, params.keep_gap) \
            + params.logits_weight * M.centred_logit_drift(z, reference)
        measured = objective._retain_term(logits, batch.labels, batch)
    assert measured.item() > 1e-4 and measured.item() == pytest.approx(expected.item(), rel=1e-5)


def test_a_run_with_an_anchor_names_it_and_plans_its_memory(fixture_model, drifted, forget_records, retain_records):
    inputs = RunInputs.of(forget_records[:4], retain_records[:8])
    params = MascParams.from_dict({"max_steps": 2, "lr": 1e-3})
    plain = unlearn(str(fixture_model), inputs, params=params).result
    anchored = unlearn(str(fixture_model), inputs, params=params, anchor=str(drifted)).result
    assert plain.anchor is None and "anchor" not in plain.as_dict()
    assert anchored.anchor == str(drifted) and anchored.as_dict()["anchor"] == str(drifted)
    assert "anchor_copy" not in plain.peak_memory["estimate"] and anchored.peak_memory["estimate"]["anchor_copy"] > 0
    # The first step's retain loss: about 0 against pi_0 (the policy is pi_0), not against the drifted anchor.
    assert plain.loss_trace[0]["retain"] < 1e-4 < anchored.loss_trace[0]["retain"]
