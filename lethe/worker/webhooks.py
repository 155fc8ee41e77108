"""The worker side of webhooks: a dispatcher thread in each worker process POSTs the deliveries that are due
(lethe.service.domain.webhooks), signed, each under a claim so that two workers never send one delivery at once, and
records every attempt. A delivery whose dispatcher dies is retried once its claim lapses: at least once.

One endpoint cannot hold the others up: deliveries go out a few at a time, one per endpoint and at most PER_TENANT
per tenant, tenants taking turns (lethe.service.domain.webhooks.fair_pick); each POST has a total deadline (a receiver
that drips its answer is cut off), the answer's body is never read, and the connection goes to the address that was
checked, not to whatever the name resolves to a moment later."""
from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx

from lethe.service.domain import webhooks
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import WebhookDelivery, WebhookEndpoint, utcnow
from lethe.service.settings import Settings, get_settings

log = logging.getLogger("lethe.client.webhooks")
CONCURRENCY = 4  # deliveries in flight per worker process
PER_TENANT = 2  # of which one tenant's at most: the others' deliveries always find a slot


def post(url: str, address: str, body: bytes, headers: dict[str, str], deadline: float) -> int:
    """POST to the checked address within `deadline` seconds in all; the status code (the body is not read)."""
    target, host, extensions = webhooks.pinned(url, address)
    # No redirects (one could lead to a target the check refuses), no proxies from the environment.
    with httpx.Client(timeout=deadline, follow_redirects=False, trust_env=False) as http:
        cutoff = threading.Timer(deadline, http.close)  # a drip-fed answer is cut off at the deadline
        cutoff.start()
        try:
            request = http.build_request("POST", target, content=body, headers={**headers, **host},
                                         extensions=extensions)
            answer = http.send(request, stream=True)
            answer.close()
            return answer.status_code
        finally:
            cutoff.cancel()


def deliver_once(settings: Settings, delivery_id: str, token: str) -> str | None:
    """Claim, POST and record one delivery; its new state, or None when another dispatcher holds it."""
    now = utcnow()
    deadline = settings.webhook_timeout_seconds
    with session_scope() as session:
        if not webhooks.claim(session, delivery_id, token, now, deadline * 3):
            return None
        delivery = session.get_one(WebhookDelivery, delivery_id)
        endpoint = session.get_one(WebhookEndpoint, delivery.endpoint_id)
        body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
        timestamp = int(time.time())
        headers = {"content-type": "application/json", "user-agent": "lethe-webhooks/1",
                   "webhook-id": delivery.id, "webhook-timestamp": str(timestamp),
                   "webhook-signature": webhooks.signature_header(endpoint, delivery.id, timestamp, body, now)}
        url, disabled = endpoint.url, endpoint.disabled_at is not None
    status, error, started = None, None, time.perf_counter()
    try:
        problem, address = webhooks.resolve_target(url, settings.webhook_allow_private)  # DNS may have changed
        if disabled:
            error = "the endpoint was deleted"
        elif problem or address is None:
            error = f"target refused: {problem or 'its host does not resolve'}"
        else:
            status = post(url, address, body, headers, deadline)
            if not 200 <= status < 300:
                error = f"answered {status}"
    except Exception as exc:  # every outcome is an attempt in the log, so a failing delivery reaches DEAD
        status, error = None, f"{type(exc).__name__}: {exc}"[:500]
    with session_scope() as session:
        return webhooks.record_attempt(session, delivery_id, token, status=status, error=error,
                                       milliseconds=(time.perf_counter() - started) * 1000,
                                       max_attempts=1 if disabled else settings.webhook_max_attempts,
                                       backoff=settings.webhook_backoff_seconds)


class Dispatcher(threading.Thread):
    """Every webhook_poll_seconds: the deliveries due, oldest first, a few at a time."""

    def __init__(self, settings: Settings | None = None):
        super().__init__(name="webhooks", daemon=True)
        self.settings = settings or get_settings()
        self.token = secrets.token_hex(16)
        self.stopped = threading.Event()

    def deliver(self, delivery_id: str) -> None:
        try:
            deliver_once(self.settings, delivery_id, self.token)
        except Exception:  # the database, between claim and record: the claim lapses and another round retries
            log.exception("webhook delivery %s failed", delivery_id)

    def run(self) -> None:
        """Slots are refilled as deliveries finish, never a round at a time: a slow POST holds its own slot only."""
        in_flight: dict[Future, tuple[str, str]] = {}  # each running delivery's (tenant, endpoint)
        with ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="webhook") as pool:
            while not self.stopped.wait(self.settings.webhook_poll_seconds):
                for future in [f for f in in_flight if f.done()]:
                    del in_flight[future]
                if len(in_flight) == CONCURRENCY:
                    continue
                try:
                    with session_scope() as session:
                        heads = webhooks.due_heads(session, utcnow())
                    for delivery_id, tenant, endpoint in webhooks.fair_pick(
                            heads, list(in_flight.values()), CONCURRENCY - len(in_flight), PER_TENANT):
                        in_flight[pool.submit(self.deliver, delivery_id)] = (tenant, endpoint)
                except Exception:  # a database hiccup: the next round tries again
                    log.exception("webhook dispatch failed")


_dispatcher: Dispatcher | None = None


def start_dispatcher() -> Dispatcher:
    """One dispatcher per worker process (started in each pool child, where the jobs run)."""
    global _dispatcher
    if _dispatcher is None or not _dispatcher.is_alive():
        _dispatcher = Dispatcher()
        _dispatcher.start()
    return _dispatcher
