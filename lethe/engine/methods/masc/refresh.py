"""Which records a replay refresh measures again and asks for their answers: a bounded amount of work a refresh,
aimed at the records whose state is stalest (issue 28). Pure selection; the stop policy does the measuring."""
from __future__ import annotations

import math
import random
from collections.abc import Callable

from lethe.engine.data.records import EncodedRecord

REFRESHED = 64  # records a replay refresh measures again (a bounded cost, whatever the forget set)
REPLAY_SHARE = 0.2  # of the forget set, the most a refresh asks: at replay_every 20, each record every 100 steps


def to_remeasure(records: list[EncodedRecord], is_open: Callable[[str], bool], refreshed_at: dict[str, int],
                 limit: int = REFRESHED) -> list[EncodedRecord]:
    """Records measured again at a refresh: a record closed a while ago and trained no more drifts back as the retain
    term pulls towards theta_0 (on mini-TOFU 39 closed records came back while one stayed open for 250 steps), and
    must open again. At most `limit` a refresh, so that the cost does not grow with the forget set (ten coalesced
    requests measured all 400 records at every refresh; with the answers, the checks took a third of that run): every
    record where there are no more, else closed ones first (an open one is measured by its next training pass), those
    measured longest ago first. In the run's order: the same batches as before."""
    chosen = set(sorted((r.id for r in records), key=lambda rid: (is_open(rid), refreshed_at.get(rid, -1)))[:limit])
    return [r for r in records if r.id in chosen]


def to_ask(train_set: list[EncodedRecord], is_open: Callable[[str], bool] | None,
           held_by_answers: Callable[[str], bool], answered_at: dict[str, int], sample_size: int,
           rng: random.Random) -> list[EncodedRecord]:
    """The records a refresh asks for their answers. `is_open` None (holdout mode): a seeded sample of `sample_size`
    of the trained records (never one held out: its answers would train it). Else up to a fifth of the forget set:
    - a seeded sample of `sample_size` open ones;
    - more of those their answers alone hold open: their flags are all that keeps the rule from firing, and a flag
      is only as fresh as the record's last answers (ten coalesced requests asked 8 of 400 records a refresh, each
      about twice in 2,000 steps, and at step 2,000 held 284 open on leaking answers);
    - closed ones, answered longest ago first: a closed record is trained no more while the others are, and its
      answers drift back to its content or into a loop, which a stale flag hides until a confirmation fails on it
      (three coalesced requests: each of 32 failed confirmations found some); asked here, it opens and is trained
      on that answer."""
    open_records = [r for r in train_set if is_open is None or is_open(r.id)]
    asked = rng.sample(open_records, min(len(open_records), sample_size))
    budget = math.ceil(REPLAY_SHARE * len(train_set))
    if is_open is not None and len(asked) < budget:
        chosen = {r.id for r in asked}
        held = [r for r in open_records if r.id not in chosen and held_by_answers(r.id)]
        asked += rng.sample(held, min(len(held), budget - len(asked)))
        chosen |= {r.id for r in asked}
        opened = {r.id for r in open_records}  # is_open once a record: a refresh reads each record's state once
        closed = [r for r in train_set if r.id not in chosen and r.id not in opened]
        closed.sort(key=lambda r: answered_at.get(r.id, -1))  # stable: ties keep the run's order
        asked += closed[:budget - len(asked)]
    return asked
