"""Receiving Lethe's webhooks: the documented check, for a receiver in Python.

    receiver = Receiver(["whsec_..."])              # the endpoint's secret (during a rotation: old and new)
    try:
        event = receiver.verify(request_body, request_headers)
    except Duplicate:   # seen before: answer 2xx and do nothing
        ...
    except Rejected:    # forged, tampered or stale: answer 4xx
        ...

A delivery is genuine when its webhook-signature holds an HMAC-SHA256 of "webhook-id.webhook-timestamp.body" under
one of your secrets (checked by the Standard Webhooks reference library), its timestamp is within five minutes of
now, and its webhook-id has not been seen before (at-least-once delivery repeats ids; a replay does too: process
each id once). Retries can change the order in which events arrive: `data.audit_seq` (the audit log's entry) orders
them. In another language, any Standard Webhooks library does the first two checks."""
from __future__ import annotations

from collections.abc import Mapping, MutableSet
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


class Rejected(Exception):
    """A delivery that is not genuine: answer it with a 4xx."""


class Duplicate(Rejected):
    """A genuine delivery already processed (a retry, a redelivery, or a replay of it): answer it with a 2xx, so that
    the service stops retrying, and do nothing."""


class Receiver:
    def __init__(self, secrets: list[str], seen: MutableSet[str] | None = None):
        self.checks = [Webhook(s) for s in secrets]
        self.seen: MutableSet[str] = seen if seen is not None else set()  # a persistent set in production

    def verify(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
        """The event ({"type", "timestamp", "data"}) of a genuine delivery seen for the first time."""
        lowered = {k.lower(): v for k, v in headers.items()}
        errors = []
        for check in self.checks:
            try:
                event = check.verify(body, lowered)
                break
            except WebhookVerificationError as exc:
                errors.append(str(exc))
        else:
            raise Rejected("; ".join(dict.fromkeys(errors)) or "no secret")
        if lowered["webhook-id"] in self.seen:
            raise Duplicate(f"webhook-id {lowered['webhook-id']} was already processed (a redelivery or a replay)")
        self.seen.add(lowered["webhook-id"])
        return event
