"""The worker side of webhooks: a dispatcher thread in each worker process POSTs the deliveries that are due
(service.domain.webhooks), signed, each under a claim so that two workers never send one delivery at once, and
records every attempt. A delivery whose dispatcher dies is retried once its claim lapses: at least once."""
from __future__ import annotations

import json
import logging
import secrets
import threading
import time

import httpx

from service.domain import webhooks
from service.infra.db import session_scope
from service.infra.tables import WebhookDelivery, WebhookEndpoint, utcnow
from service.settings import Settings, get_settings

log = logging.getLogger("lethe.webhooks")


def deliver_once(settings: Settings, delivery_id: str, token: str, http: httpx.Client) -> str | None:
    """Claim, POST and record one delivery; its new state, or None when another dispatcher holds it."""
    now = utcnow()
    with session_scope() as session:
        if not webhooks.claim(session, delivery_id, token, now, settings.webhook_timeout_seconds * 3):
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
    if disabled:
        error = "the endpoint was deleted"
    elif problem := webhooks.target_problem(url, settings.webhook_allow_private):  # DNS may have changed since
        error = f"target refused: {problem}"
    else:
        try:
            status = http.post(url, content=body, headers=headers).status_code
            if not 200 <= status < 300:
                error = f"answered {status}"
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:  # every outcome is an attempt in the log
            error = f"{type(exc).__name__}: {exc}"[:500]
    with session_scope() as session:
        return webhooks.record_attempt(session, delivery_id, token, status=status, error=error,
                                       milliseconds=(time.perf_counter() - started) * 1000,
                                       max_attempts=1 if disabled else settings.webhook_max_attempts,
                                       backoff=settings.webhook_backoff_seconds)


class Dispatcher(threading.Thread):
    """Every webhook_poll_seconds: the deliveries due, oldest first, one at a time."""

    def __init__(self, settings: Settings | None = None):
        super().__init__(name="webhooks", daemon=True)
        self.settings = settings or get_settings()
        self.token = secrets.token_hex(16)
        self.stopped = threading.Event()

    def run(self) -> None:
        # No redirects: a redirect could point a delivery at a target the check above refuses.
        with httpx.Client(timeout=self.settings.webhook_timeout_seconds, follow_redirects=False) as http:
            while not self.stopped.wait(self.settings.webhook_poll_seconds):
                try:
                    with session_scope() as session:
                        ready = webhooks.due(session, utcnow())
                    for delivery_id in ready:
                        if self.stopped.is_set():
                            return
                        deliver_once(self.settings, delivery_id, self.token, http)
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
