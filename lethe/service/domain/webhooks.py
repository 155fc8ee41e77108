"""Signed webhooks (issue 14): a tenant's endpoints receive every job state change, new version and report as a
POST in the Standard Webhooks format (webhook-id, webhook-timestamp, webhook-signature = "v1," + base64 of
HMAC-SHA256 over "id.timestamp.body" with the endpoint's secret).

The outbox: each audit-log entry of an event kind becomes one delivery row per subscribed endpoint, in the same
transaction as the change it reports (audit_log.append calls `enqueue`), so no event is lost and none is sent for
a change that rolled back. Workers deliver them (lethe.worker.webhooks): at least once, with exponential backoff, then
DEAD (the dead letter) after the last attempt; a delivery keeps its id (the receivers' deduplication key) when
redelivered. Targets on loopback, link-local or private networks are refused unless the operator allows them."""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import socket
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from lethe.service.domain.errors import invalid
from lethe.service.infra.tables import AuditEntry, WebhookDelivery, WebhookEndpoint, utcnow

EVENTS = ("job.queued", "job.running", "job.cancelling", "job.succeeded", "job.failed", "job.cancelled",
          "version.created", "version.retired", "version.purged", "report.created", "connectivity.measured")
MAX_BACKOFF = 3600.0
# The key under which audit entries written before issue 26 named a request's subjects by plain sha256 (guessable from
# a list of ids): kept in the chain, never shown to readers or receivers.
PLAIN_SUBJECT_HASHES = "subjects_sha256"
# What the audit log records and a tenant's receiver need not see: the worker's host, and those hashes.
PRIVATE_DATA = ("worker", PLAIN_SUBJECT_HASHES)
LOG_KEPT = 50  # attempts a delivery's log keeps (the latest)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One Standard Webhooks signature: "v1," + base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}"))."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(endpoint: WebhookEndpoint, msg_id: str, timestamp: int, body: bytes, now: datetime) -> str:
    """The current secret's signature, and the previous secret's while a rotation's grace lasts (space-separated,
    as the format allows, so that a receiver holding either secret verifies)."""
    keys = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_until and endpoint.previous_until > now:
        keys.append(endpoint.previous_secret)
    return " ".join(sign(k, msg_id, timestamp, body) for k in keys)


def check_events(events: list[str]) -> list[str]:
    for event in events:
        if event != "*" and event not in EVENTS and not (event.endswith(".*") and
                                                         any(e.startswith(event[:-1]) for e in EVENTS)):
            raise invalid(f"events: {event!r} is not one of {', '.join(EVENTS)}, a prefix like \"job.*\", or \"*\"",
                          "events")
    return list(dict.fromkeys(events))


def subscribed(events: list[str], event: str) -> bool:
    return any(e == "*" or e == event or (e.endswith(".*") and event.startswith(e[:-1])) for e in events)


def resolve_target(url: str, allow_private: bool) -> tuple[str | None, str | None]:
    """(why the URL may not receive deliveries, the address to connect to). Allowed: http(s) with a host and no
    credentials, and unless the operator allows private targets, every address the host resolves to globally
    routable (no loopback, link-local, private, shared, multicast or reserved range: a tenant must not reach the
    service's own network). The address is what a delivery connects to, so that a name resolved again between
    the check and the connection (DNS rebinding) cannot point it elsewhere."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:  # an unclosed IPv6 bracket, a port out of range
        return f"is not a URL ({exc})", None
    if parts.scheme not in ("http", "https") or not host:
        return "must be an http:// or https:// URL with a host", None
    if parts.username or parts.password:
        return "must not carry credentials (the signature authenticates the sender)", None
    try:
        addresses = sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
    except (OSError, ValueError) as exc:
        return (None, None) if allow_private else (f"its host does not resolve ({exc})", None)
    for address in addresses:
        if not allow_private and not public_address(ipaddress.ip_address(address.split("%")[0])):
            return f"resolves to {address}, which is not a public address (loopback, link-local or private)", None
    return None, addresses[0] if addresses else None


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052's well-known prefix: the IPv4 address is the last 32 bits
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated, but a stack may still route ::a.b.c.d to a.b.c.d
GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")


def public_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a delivery may connect to `ip`. IPv4: globally routable. IPv6 that carries an IPv4 address (mapped,
    NAT64's well-known prefix, IPv4-compatible, 6to4, Teredo): the IPv4 addresses it reaches must be, since a
    translator or relay delivers there (on an IPv6-only cluster with NAT64, 64:ff9b::a00:1 is 10.0.0.1). Any other
    IPv6: global unicast (2000::/3) and globally routable, so NAT64's local-use prefix 64:ff9b:1::/48 is refused."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip.is_global
    embedded: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        embedded = [ip.ipv4_mapped]
    elif ip in NAT64 or ip in IPV4_COMPATIBLE:
        embedded = [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]  # :: and ::1 give 0.0.0.0 and 0.0.0.1: refused
    elif ip.sixtofour is not None:
        embedded = [ip.sixtofour]
    elif ip.teredo is not None:
        embedded = list(ip.teredo)  # the Teredo server and the client behind it
    if embedded:
        return all(v4.is_global for v4 in embedded)
    return ip in GLOBAL_UNICAST and ip.is_global


def target_problem(url: str, allow_private: bool) -> str | None:
    return resolve_target(url, allow_private)[0]


def pinned(url: str, address: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """The URL with its host replaced by the checked address, the Host header, and (https) the name the TLS
    handshake and certificate check still use."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{address}]" if ":" in address else address) + (f":{parts.port}" if parts.port else "")
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return parts._replace(netloc=netloc).geturl(), {"host": parts.netloc.rsplit("@", 1)[-1]}, extensions


def check_url(url: str, allow_private: bool) -> str:
    if problem := target_problem(url, allow_private):
        raise invalid(f"url {url!r}: {problem}", "url")
    return url


def enqueue(session: Session, entry: AuditEntry) -> None:
    """One delivery per active endpoint of the entry's tenant that subscribes to its kind (called by append)."""
    if entry.kind not in EVENTS:
        return
    endpoints = session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.tenant == entry.tenant,
                                                              WebhookEndpoint.disabled_at.is_(None))).all()
    data = {k: v for k, v in entry.data.items() if k not in PRIVATE_DATA}
    payload = {"type": entry.kind, "timestamp": entry.at.isoformat(),
               "data": {"id": entry.subject, **data, "audit_seq": entry.seq}}
    for endpoint in endpoints:
        if subscribed(endpoint.events, entry.kind):
            session.add(WebhookDelivery(tenant=entry.tenant, endpoint_id=endpoint.id, event=entry.kind,
                                        payload=payload, state="PENDING", attempts=0, next_attempt_at=entry.at,
                                        log=[]))


def due_heads(session: Session, now: datetime) -> list[tuple[str, str, str]]:
    """(delivery id, tenant, endpoint id) of each endpoint's oldest due delivery, oldest first, leaving out endpoints
    with a delivery in flight (a live claim, by any dispatcher): an endpoint gets one POST at a time, so a slow one
    holds one slot, and a tenant's backlog on one endpoint never hides another's deliveries."""
    live = select(WebhookDelivery.endpoint_id).where(WebhookDelivery.state == "PENDING",
                                                     WebhookDelivery.claimed_until >= now)
    ready = select(WebhookDelivery.id, WebhookDelivery.tenant, WebhookDelivery.endpoint_id, WebhookDelivery.created_at,
                   func.row_number().over(partition_by=WebhookDelivery.endpoint_id,
                                          order_by=(WebhookDelivery.created_at, WebhookDelivery.id)).label("rank")
                   ).where(WebhookDelivery.state == "PENDING", WebhookDelivery.next_attempt_at <= now,
                           or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now),
                           WebhookDelivery.endpoint_id.not_in(live)).subquery()
    rows = session.execute(select(ready.c.id, ready.c.tenant, ready.c.endpoint_id).where(ready.c.rank == 1)
                           .order_by(ready.c.created_at)).all()
    return [(row[0], row[1], row[2]) for row in rows]


def fair_pick(heads: list[tuple[str, str, str]], busy: list[tuple[str, str]], slots: int,
              per_tenant: int) -> list[tuple[str, str, str]]:
    """Which of `heads` (oldest first) to start in `slots` free slots, given the (tenant, endpoint) pairs already in
    flight here: tenants take turns (round robin, the one with the oldest delivery first), each at most `per_tenant`
    in flight, one per endpoint."""
    in_flight: dict[str, int] = {}
    for tenant, _ in busy:
        in_flight[tenant] = in_flight.get(tenant, 0) + 1
    taken_endpoints = {endpoint for _, endpoint in busy}
    queues: dict[str, list[tuple[str, str, str]]] = {}
    for head in heads:
        if head[2] not in taken_endpoints:
            queues.setdefault(head[1], []).append(head)
    picked: list[tuple[str, str, str]] = []
    while len(picked) < slots:
        progressed = False
        for tenant, waiting in queues.items():  # insertion order: the tenant with the oldest delivery first
            if len(picked) == slots:
                break
            if waiting and in_flight.get(tenant, 0) < per_tenant:
                picked.append(waiting.pop(0))
                in_flight[tenant] = in_flight.get(tenant, 0) + 1
                progressed = True
        if not progressed:
            break
    return picked


def claim(session: Session, delivery_id: str, token: str, now: datetime, seconds: float) -> bool:
    """Compare-and-set: this dispatcher takes the delivery for `seconds`, unless another holds it."""
    taken = session.execute(update(WebhookDelivery).where(
        WebhookDelivery.id == delivery_id, WebhookDelivery.state == "PENDING",
        or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now))
        .values(claimed_by=token, claimed_until=now + timedelta(seconds=seconds))
        .execution_options(synchronize_session=False))
    return bool(getattr(taken, "rowcount", 0))


def record_attempt(session: Session, delivery_id: str, token: str, *, status: int | None, error: str | None,
                   milliseconds: float, max_attempts: int, backoff: float) -> str | None:
    """The outcome of one POST by the claim's holder: DELIVERED on a 2xx; else the next attempt after
    backoff * 2^(attempts - 1) seconds (at most an hour), or DEAD after max_attempts. None when the claim was
    lost (the delivery was redelivered or taken over meanwhile): nothing is written."""
    delivery = session.get(WebhookDelivery, delivery_id, with_for_update=True)
    if delivery is None or delivery.claimed_by != token or delivery.state != "PENDING":
        return None
    now = utcnow()
    delivery.attempts += 1
    entry = {"at": now.isoformat(), "attempt": delivery.attempts, "status": status, "error": error,
             "ms": round(milliseconds, 1)}
    delivery.log = [*delivery.log, entry][-LOG_KEPT:]
    delivery.claimed_by, delivery.claimed_until = None, None
    if status is not None and 200 <= status < 300:
        delivery.state, delivery.delivered_at = "DELIVERED", now
    elif delivery.attempts >= max_attempts:
        delivery.state = "DEAD"
    else:
        delay = min(MAX_BACKOFF, backoff * 2 ** (delivery.attempts - 1))
        delivery.next_attempt_at = now + timedelta(seconds=delay)
    return delivery.state


def redeliver(delivery: WebhookDelivery) -> None:
    """Queue a delivery again now (a DEAD one too), with a fresh budget of attempts and the same webhook-id."""
    delivery.state, delivery.attempts, delivery.next_attempt_at = "PENDING", 0, utcnow()
    delivery.claimed_by, delivery.claimed_until = None, None


def rotate(endpoint: WebhookEndpoint, grace_seconds: float) -> str:
    """A new secret; the old one keeps signing for `grace_seconds`, so receivers can switch without a gap."""
    endpoint.previous_secret, endpoint.previous_until = endpoint.secret, utcnow() + timedelta(seconds=grace_seconds)
    endpoint.secret = new_secret()
    return endpoint.secret
