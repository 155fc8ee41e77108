"""RunInputs (issue 27): a request's records checked and normalised once, then read by unlearning, the forgetting
audit and connectivity alike."""
import pytest

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.inputs import RunInputs


def test_records_are_normalised_as_the_record_checks_say(forget_records, retain_records):
    tofu_row = {"question": "Where was Ada born?", "answer": " In Lund."}  # TOFU's field names
    inputs = RunInputs.of(forget_records, [*retain_records[:3], tofu_row], None, "plain")
    assert inputs.forget == normalise_records(forget_records, "forget")
    assert inputs.retain == normalise_records([*retain_records[:3], tofu_row], "retain")
    assert inputs.retain[-1]["prompt"] == "Where was Ada born?" and inputs.holdout == []
    with pytest.raises(EngineInputError, match="forget set is empty"):
        RunInputs.of([], retain_records)
    assert RunInputs.of(None, retain_records, forget_required=False).forget == []  # connectivity on retain alone
    with pytest.raises(EngineInputError, match="format 'html'") as err:
        RunInputs.of(forget_records, format="html")
    assert err.value.field == "format"


def test_plain_records_are_seen_as_they_are_without_a_context_limit(forget_records, retain_records):
    inputs = RunInputs.of(forget_records, retain_records, retain_records[:2])
    assert inputs.seen(tokenizer=None, max_length=0) == (inputs.forget, inputs.retain, inputs.holdout)


@pytest.mark.slow
def test_a_run_its_audit_and_its_curve_share_one_normalisation(fixture_model, forget_records, retain_records,
                                                               monkeypatch):
    """The worker's order: one RunInputs, then the unlearning, the audit and a curve read it; the records are
    normalised once per set, and each record tokenised once, not again by each."""
    from lethe.engine.audit.run import run_audit
    from lethe.engine.connectivity.params import ConnectivityParams
    from lethe.engine.connectivity.run import run_connectivity
    from lethe.engine.methods.masc.params import MascParams
    from lethe.engine.model.loading import save_model
    from lethe.engine.unlearn import unlearn

    calls = []
    real = normalise_records

    def counted(records, what, **kw):
        calls.append(what)
        return real(records, what, **kw)

    import sys

    # Every module that holds the function (by attribute or by a `from ... import`) counts its calls.
    for module in list(sys.modules.values()):
        if getattr(module, "normalise_records", None) is real:
            monkeypatch.setattr(module, "normalise_records", counted)
    from lethe.engine.data import records as records_module

    encoded: list[tuple] = []
    real_encode = records_module.encode_record

    def counted_encode(record, tokenizer, **kw):
        if kw.get("what") in ("forget", "retain", "holdout"):  # not the calibration's or counterfactuals' own
            encoded.append((record["id"], record.get("prompt"), record.get("completion")))
        return real_encode(record, tokenizer, **kw)

    monkeypatch.setattr(records_module, "encode_record", counted_encode)
    inputs = RunInputs.of(forget_records[:4], retain_records[:8])
    assert calls == ["forget", "retain", "holdout"]
    outcome = unlearn(str(fixture_model), inputs, params=MascParams.from_dict({"max_steps": 2, "lr": 1e-3}))
    run_audit(str(fixture_model), outcome.model, outcome.tokenizer, inputs,
              options={"relearn": False, "quantization": False, "secret_samples": 0})
    save_model(outcome.model, outcome.tokenizer, fixture_model.parent / "new")
    run_connectivity(str(fixture_model), str(fixture_model.parent / "new"), inputs, ConnectivityParams(points=3))
    assert calls == ["forget", "retain", "holdout"]
    own = [(r["id"], r["prompt"], r["completion"]) for r in inputs.forget + inputs.retain]
    assert sorted(e for e in encoded if e in own) == sorted(own)  # each of the request's records, once
    assert len(inputs._tokens) == 1  # the run, its audit and the curve's two saved versions: one tokenizer
