"""The served check's 4-bit reading (issue 28): the audit asks a 4-bit copy of the new version for greedy answers
(its "quantized" channel, lethe.engine.audit.quantize), so the rule asks it too before it lets a run stop. A record
whose 4-bit answer says one of its secrets stays open. Measured before this check: one llama seed of the customer
benchmark stopped with every record erased in the saved copy while its 4-bit copy still said a phone number. The
leaking answer is then trained on as a sampled one is (Replays.keep_first_leaks): the full-precision policy's own
answers are clean by then, so without it nothing trains the path the 4-bit copy takes.

A 4-bit answer is held to its own record's content only, as the audit reads it; the full-precision answers are still
held to every forget record's. Measured on the chain of issue 28 (BENCHMARKS.md): on a small model the rounding turns
some answers into word salad that holds another record's span by chance, a different record at each check, and held
to every record's content the rule kept failing its served check on such salad (requests 1 and 2: 5 and 3 served
checks, 745 and 1,325 steps; held to its own, 2 and 1, 590 and 835)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lethe.engine.audit.quantize import quantized_in_place
from lethe.engine.methods.masc.stop_rule import RecordCheck

QUANTIZED = "quantized"  # the replayed example a 4-bit copy's leaking answer becomes (record id + "#quantized")


def quantized_leaks(model: Any, checks: list[RecordCheck],
                    ask: Callable[[list[RecordCheck], Any], list[RecordCheck]]) -> tuple[set[str], str]:
    """The ids of the records whose greedy answers from `model` held at 4 bits leak (`ask`: the policy's
    with_answers), and the scheme's name. The model is quantised in place and restored after."""
    with quantized_in_place(model) as scheme:
        asked = ask(checks, model)
    return {c.id for c in asked if c.leaked}, scheme
