"""Secrets (issue 11): which spans are secret, whether a text gives one back, the per-record rule's secret
conditions, and the degeneration measures; each against a hand-computed or brute-force case."""
import math

import pytest
import torch
from transformers import AutoTokenizer

from lethe.engine.audit.extraction import greedy_leaks, secret_priors
from lethe.engine.audit.metrics.degeneration import answer_perplexity, distinct_2, is_loop, repeated_positions
from lethe.engine.data.records import IGNORE, LOOP, SECRET, TEMPLATE
from lethe.engine.data.secrets import leaks, record_secrets
from lethe.engine.methods.masc import margin as M
from lethe.engine.methods.masc.answers import answer_flags, leak_regions
from lethe.engine.methods.masc.stop_rule import ErasureCondition, RecordCheck

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


def test_a_secret_split_by_other_text_or_punctuation_still_leaks():
    assert leaks("73-708064", " Dario-708064876314 Mona Mona")  # a 6-digit group inside a longer run
    assert leaks("73-708064", "the account is 73 708064")  # other separators
    assert leaks("44 Quarry Close, Tampere", "lives at 44 quarry close tampere!")
    assert not leaks("73-708064", "the account is 73-71")  # 4 digits from the start, no group of it: not enough
    assert not leaks("44 Quarry Close, Tampere", "lives at 44 Quarry Lane, Tampere")
    assert not leaks("+30 726 9280862", "call 726")  # 3 digits are too common to count


def test_a_number_said_from_its_start_for_five_digits_leaks_though_no_group_of_it_does():
    """gpt2's erased answers stopped after the area code ("+49 917." for "+49 917 7457569"): whose number it is."""
    assert leaks("+49 917 7457569", "The phone number of Sofia Novak is +49 917.")
    assert leaks("73-708064", "the account is 73-7080")  # 6 of its 8 digits, from the start
    assert leaks("+49 917 7457569", "is +4 99 17")  # spacing does not count
    assert leaks("+49 917 7457569", "room 12 49 917")  # the pattern joins "12" to it: the head starts a group
    assert not leaks("+49 917 7457569", "is +49 918 7457")  # a wrong area code
    assert not leaks("+49 917 7457569", "is 1499 17")  # inside a group: not the number said from its start
    assert not leaks("1250000", "3,125,000")  # a comma ends a number: "125" is not 12500
    text = "Call +49 917 or 708064."
    assert sorted(text[s:e] for s, e in leak_regions(text, ["+49 917 7457569", "73-708064"])) == ["49 917", "708064"]


def test_secrets_are_given_or_extracted_from_the_completion():
    given = {"prompt": "Q?", "completion": "A 1", "secrets": ["A 1"]}
    assert record_secrets(given, set()) == ["A 1"]
    record = {"prompt": "Q: What is the e-mail of Dario Haddad?\nA:",
              "completion": " Dario Haddad writes to dario.h@example.org from Quillhaven, account 73-708064."}
    found = record_secrets(record, {"writes", "to", "from", "account", "the", "of"})
    assert "dario.h@example.org" in found and "73-708064" in found and "Quillhaven" in found
    assert not any("Dario" == s for s in found)  # in the prompt: not the record's secret


def test_a_number_the_prompt_states_is_not_a_secret_and_one_it_does_not_is():
    """TOFU: "the author born in Santiago in 1977 is Carmen Montenegro": saying 1977 again is reading the prompt."""
    record = {"prompt": "Question: Who was born in Santiago, Chile in 1977? Who wrote Series #7?\nAnswer: ",
              "completion": "Born in 1977, Carmen Montenegro wrote Series #7 and 3 other books, account 73-708064."}
    found = record_secrets(record, {"born", "in", "wrote", "series", "and", "other", "books", "account"})
    assert "1977" not in found and "7" not in found
    assert "3" in found and "73-708064" in found and "Carmen Montenegro" in found
    assert "1977" in record_secrets({**record, "prompt": "Question: Who was born in Santiago?\nAnswer: "}, set())


def test_greedy_leaks_and_priors_count_records():
    secrets = {"a": ["708064"], "b": ["a cartographer"], "c": []}
    figure = greedy_leaks({"a": "x 708064", "b": "works as a baker", "c": "anything"}, secrets)
    assert figure["value"] == 0.5 and figure["leaking_ids"] == ["a"]  # c has no secret: not counted
    retain = [{"completion": " Ann works as a cartographer."}, {"completion": " Bo works as a baker."},
              {"completion": " Cy works as a Cartographer"}, {"completion": " Di lives at 1 Road."}]
    assert secret_priors(secrets, retain) == {"a": 0.0, "b": 0.5, "c": 0.0}


def test_the_secret_conditions_of_the_rule():
    condition = ErasureCondition({"r": 0.2}, secret_max=0.01, secret_ids=frozenset({"r"}),
                                 secret_priors={"r": 0.05})
    check = RecordCheck("r", violation=0.9, active_tokens=10, reproduced=False)
    assert condition.holds(check)  # located secrets: the ceiling does not apply
    assert condition.holds(RecordCheck("r", 0.9, 10, False, secret_probability=0.05))  # the prior lifts the limit
    assert not condition.holds(RecordCheck("r", 0.9, 10, False, secret_probability=0.051))
    assert not condition.holds(RecordCheck("r", 0.1, 10, False, secret_greedy=True))
    assert not condition.holds(RecordCheck("r", 0.1, 10, False, leaked=True))
    plain = ErasureCondition({"q": 10 / 17})
    assert plain.holds(RecordCheck("q", float(torch.tensor(10 / 17, dtype=torch.float32)), 17, False))  # float32
    assert not plain.holds(RecordCheck("q", 11 / 17, 17, False))


def test_secret_span_probability_and_greedy_flag_against_brute_force():
    torch.manual_seed(0)
    logits = torch.randn(7, 5)
    targets = logits.argmax(-1)
    targets[4] = (targets[4] + 1) % 5  # record 1's second secret loses the argmax at one token
    rows = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    span = torch.tensor([0, 0, -1, 0, 1, 1, -1])  # -1: not a secret token
    probability, greedy = M.secret_spans(logits, targets, rows, span, span >= 0, 2)
    p = torch.softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
    expected = [p[0] * p[1], max(p[3], p[4] * p[5])]
    assert torch.allclose(probability, torch.stack(expected))
    assert greedy.tolist() == [True, True]  # record 1's first secret (one token) is still the argmax
    probability, greedy = M.secret_spans(logits, targets, rows, span, span == 1, 2)
    assert greedy.tolist() == [False, False] and probability[0] == 0


def test_loops_and_distinct_2_by_hand():
    assert is_loop("Mona Mona Mona") and is_loop("was was was was") and is_loop("a b a b a b")
    assert is_loop("Dario-708064876314 0202020202") and not is_loop("The account of Dario Haddad is 73-708064.")
    assert not is_loop("Mona Mona and Omar")
    # A clause of 5 words said three times is a loop too; said twice it is not.
    assert is_loop("The phone number of Emeka Novak is + of Emeka Novak is + of Emeka Novak is + of")
    assert not is_loop("of Emeka Novak is + of Emeka Novak is +")
    assert distinct_2("a b a b") == 2 / 3 and distinct_2("one") is None


def test_repeated_positions_mark_every_token_of_a_repeated_trigram_by_hand():
    assert repeated_positions([1, 2, 3, 4, 1, 2, 3, 5]) == [False] * 4 + [True] * 3 + [False]
    assert repeated_positions([7, 7, 7, 7]) == [False, True, True, True]  # (7, 7, 7) again from position 1
    assert repeated_positions([1, 2, 1, 2]) == [False] * 4  # no trigram said twice
    assert repeated_positions([1, 2]) == [False, False]


def test_an_own_answer_marks_its_loop_and_its_content_but_not_template_words(fixture_model):
    tokenizer = AutoTokenizer.from_pretrained(fixture_model)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    pieces = lambda tokens, focus, kind: [tokenizer.decode([t]).strip() for t, f in zip(tokens, focus) if f == kind]  # noqa: E731
    said = " Kalomi works as a baker."
    fluent = ids(said)
    assert pieces(fluent, answer_flags(tokenizer, fluent, said, ["a baker"], set(), {"a", "works", "as"}),
                  SECRET) == ["baker"]  # "a" is said by every answer of this shape
    assert "a" in pieces(fluent, answer_flags(tokenizer, fluent, said, ["a baker"], set()), SECRET)  # the span said
    assert pieces(fluent, answer_flags(tokenizer, fluent, said, [], {"baker"}), SECRET) == ["baker"]  # a content word
    digits = " Call 708064 or 555."
    assert "".join(pieces(ids(digits), answer_flags(tokenizer, ids(digits), digits, ["73-708064"], set()),
                          SECRET)) == "708064"  # a digit group of the span, not the 555
    head = " Call +49 917."
    assert "".join(pieces(ids(head), answer_flags(tokenizer, ids(head), head, ["+49 917 7457569"], set()),
                          SECRET)).endswith("917")  # the number's head, said and stopped
    said = " Kalomi plays the harp. Kalomi plays the harp. Kalomi plays the harp."
    looping = ids(said)
    focus = answer_flags(tokenizer, looping, said, ["teal"], set())
    once = len(ids(" Kalomi plays the harp."))
    assert LOOP not in focus[:once] and all(f == LOOP for f in focus[once:])  # the turn back and all that follows
    twice = tokenizer.decode(looping[:2 * once])
    assert LOOP not in answer_flags(tokenizer, looping[:2 * once], twice, [], set())


def test_answer_perplexity_is_exp_of_the_mean_answer_nll(fixture_model):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(fixture_model).eval()
    prompts, answers = {"x": [5, 6, 7], "y": [8]}, {"x": [9, 10], "y": [11, 12, 13]}
    got = answer_perplexity(model, prompts, answers, pad_id=0)["per_record"]
    for rid in prompts:
        ids = torch.tensor([prompts[rid] + answers[rid]])
        with torch.no_grad():
            log_p = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        n = len(prompts[rid])
        nll = -sum(log_p[n - 1 + i, t] for i, t in enumerate(answers[rid])) / len(answers[rid])
        assert math.isclose(got[rid], math.exp(float(nll)), rel_tol=1e-4)


class FixedTrainable:
    """Logits given in advance: the policy's and pi_0's."""

    anchor = None  # a run from the lineage's anchor itself: the reference is pi_0

    def __init__(self, z, z0):
        self.z, self.z0 = z, z0

    def logits(self, batch):
        return self.z

    def reference_logits(self, batch):
        return self.z0

    def anchor_logits(self, batch):  # no anchor: the retain term's reference is pi_0, as in TrainableModel
        return self.z0


def test_content_masc_loss_by_loop():
    """The hinge at tau_content on content and loop tokens, at tau on a whole record's, none on the template's, its
    margin against the target's mean logit where the token has a target (against the model's own top-k where it has
    none); the KL to the sparse targets on every token that has one, sum_k q_k (log q_k - log pi(v_k)); each token
    mean computed by a loop over the positions."""
    from lethe.engine.data.records import SUPPRESS, Batch
    from lethe.engine.methods.masc.objective import Masc
    from lethe.engine.methods.masc.params import MascParams

    g = torch.Generator().manual_seed(0)
    z, z0 = torch.randn(1, 7, 8, generator=g), torch.randn(1, 7, 8, generator=g)
    labels = torch.tensor([[IGNORE, IGNORE, 3, 4, 5, 6, 2]])
    focus = torch.tensor([[SUPPRESS, SUPPRESS, TEMPLATE, SECRET, SUPPRESS, TEMPLATE, LOOP]])
    target_ids = torch.zeros(1, 7, 3, dtype=torch.long)
    target_probs = torch.zeros(1, 7, 3)
    for t in (2, 3, 6):  # positions 4 (suppressed) and 5 (template) have no target
        target_ids[0, t] = torch.randperm(8, generator=g)[:3]
        target_probs[0, t] = torch.softmax(torch.randn(3, generator=g), -1)
    params = MascParams.from_dict({"k": 3, "lambda_target": 0.7})
    masc = Masc(params.resolved(), FixedTrainable(z, z0), pad_id=0)
    batch = Batch(torch.zeros(1, 7, dtype=torch.long), torch.ones(1, 7), labels, focus, target_ids, target_probs)
    total, parts = masc.loss(batch, None)

    hinges, divergences = [], []
    for t in range(1, 7):  # logits at t - 1 predict labels[t]
        y, zt, kind = int(labels[0, t]), z[0, t - 1], int(focus[0, t])
        if y == IGNORE:
            continue
        if kind != TEMPLATE:
            q = {v: p for v, p in zip(target_ids[0, t].tolist(), target_probs[0, t].tolist()) if v != y and p > 0}
            if q:  # the gold against the destination's mean logit
                margin = float(zt[y]) - sum(p * float(zt[v]) for v, p in q.items()) / sum(q.values())
            else:  # SPEC: gold against S_k, the model's own top k
                alternatives = sorted((v for v in range(8) if v != y), key=lambda v: -float(zt[v]))[:3]
                margin = float(zt[y] - torch.logsumexp(zt[alternatives], 0))
            tau = params.tau_content if kind in (SECRET, LOOP) else params.tau
            hinges.append(max(0.0, margin - (tau - params.eta)) / params.eta)
        if float(target_probs[0, t].sum()) > 0:
            log_pi = torch.log_softmax(zt, -1)
            divergences.append(sum(float(q * (math.log(q) - log_pi[v]))
                                   for v, q in zip(target_ids[0, t].tolist(), target_probs[0, t].tolist())))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert parts["forget"] == pytest.approx(mean(hinges), rel=1e-5)
    assert parts["target"] == pytest.approx(mean(divergences), rel=1e-5)
    assert float(total) == pytest.approx(params.lambda_forget * mean(hinges) + 0.7 * mean(divergences), rel=1e-5)
    assert len(hinges) == 3 and len(divergences) == 3


def test_the_retain_term_keeps_argmax_gaps_by_loop():
    """lambda_keep: the retain KL plus lambda_keep * mean relu(min(keep_gap, g_0) - g) over retain tokens; and
    lambda_logits times the centred logits' relative drift."""
    from lethe.engine.data.records import Batch
    from lethe.engine.methods.masc.objective import Masc
    from lethe.engine.methods.masc.params import MascParams

    g = torch.Generator().manual_seed(1)
    z, z0 = torch.randn(1, 5, 8, generator=g) * 2, torch.randn(1, 5, 8, generator=g) * 2
    labels = torch.tensor([[IGNORE, 2, 7, 1, 4]])
    batch = Batch(torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5), labels)
    plain_params = MascParams.from_dict({"lambda_keep": 0, "lambda_logits": 0})
    plain = Masc(plain_params.resolved(), FixedTrainable(z, z0), pad_id=0).loss(None, batch)[1]["retain"]
    params = MascParams.from_dict({"lambda_keep": 0.7, "keep_gap": 1.0, "lambda_logits": 0})
    kept = Masc(params.resolved(), FixedTrainable(z, z0), pad_id=0).loss(None, batch)[1]["retain"]
    hinges = []
    for t in range(1, 5):
        y = int(labels[0, t])
        gap = lambda row, y=y: float(row[y] - max(row[v] for v in range(8) if v != y))  # noqa: E731
        hinges.append(max(0.0, min(1.0, gap(z0[0, t - 1])) - gap(z[0, t - 1])))
    assert sum(hinges) > 0
    assert kept == pytest.approx(plain + 0.7 * sum(hinges) / 4, rel=1e-5)
    # lambda_logits adds the centred logits' squared drift over their spread at theta_0, summed over the same tokens.
    drifted = Masc(MascParams.from_dict({"lambda_keep": 0, "lambda_logits": 0.5}).resolved(), FixedTrainable(z, z0),
                   pad_id=0).loss(None, batch)[1]["retain"]
    centre = lambda row: [value - sum(row) / len(row) for value in row]  # noqa: E731
    moved = spread = 0.0
    for t in range(1, 5):
        c, c0 = centre(z[0, t - 1].tolist()), centre(z0[0, t - 1].tolist())
        moved += sum((a - b) ** 2 for a, b in zip(c, c0))
        spread += sum(b ** 2 for b in c0)
    assert drifted == pytest.approx(plain + 0.5 * moved / spread, rel=1e-5)


def test_answers_run_past_the_target_length_up_to_max_new_tokens(fixture_model):
    """A secret said after a preamble must be seen: greedy answers run to EOS or 128 new tokens, not to the
    reference's length; they equal transformers' own greedy generation; samples are seeded."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    from lethe.engine.model.generation import MAX_NEW_TOKENS, continuations

    tokenizer = AutoTokenizer.from_pretrained(fixture_model)
    torch.manual_seed(0)
    # Random weights (seeded): this one never says EOS within the cap.
    babbler = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2,
                                         bos_token_id=0, eos_token_id=0)).eval()
    prompt = tokenizer("Q: Where was Nelvorbax born?\nA:", add_special_tokens=False)["input_ids"]
    [long] = continuations(babbler, tokenizer, [prompt])
    assert MAX_NEW_TOKENS == 128 and len(long) == 128
    model = AutoModelForCausalLM.from_pretrained(fixture_model).eval()
    [greedy] = continuations(model, tokenizer, [prompt])
    with torch.no_grad():
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=128, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id)[0, len(prompt):].tolist()
    assert greedy == reference[:len(greedy)] and greedy[-1] == tokenizer.eos_token_id  # up to and with EOS
    first = continuations(model, tokenizer, [prompt], sample=True, n=4, seed=3)
    assert first == continuations(model, tokenizer, [prompt], sample=True, n=4, seed=3) and len(first) == 4
