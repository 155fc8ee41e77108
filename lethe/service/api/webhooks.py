"""/v1/webhooks: a tenant's endpoints for signed event deliveries (Standard Webhooks), their delivery log,
redelivery and secret rotation (issue 14). Managing endpoints takes an admin key of the tenant; reading the log
takes jobs:read."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Header, Query, Request
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lethe.service.api.auth import Principal, require
from lethe.service.api.idempotency import idempotent
from lethe.service.api.pagination import paginate
from lethe.service.api.schemas import DeliveryOut, Page, WebhookCreate, WebhookOut
from lethe.service.domain import audit_log, webhooks
from lethe.service.domain.errors import Problem, not_found
from lethe.service.domain.jobs import ENDPOINTS_LOCK, lock_tenant
from lethe.service.infra.db import INJECTED, transactional
from lethe.service.infra.tables import WebhookDelivery, WebhookEndpoint, utcnow
from lethe.service.settings import get_settings

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


def endpoint_out(endpoint: WebhookEndpoint, secret: str | None = None) -> dict:
    """An endpoint as the API shows it: its secret only in the answers that create or rotate it."""
    return {"id": endpoint.id, "url": endpoint.url, "events": endpoint.events, "description": endpoint.description,
            "created_at": endpoint.created_at, "disabled_at": endpoint.disabled_at,
            "previous_secret_valid_until": endpoint.previous_until if endpoint.previous_secret else None,
            "secret": secret}


def delivery_out(d: WebhookDelivery) -> dict:
    return {"id": d.id, "endpoint_id": d.endpoint_id, "event": d.event, "state": d.state, "attempts": d.attempts,
            "next_attempt_at": d.next_attempt_at if d.state == "PENDING" else None, "created_at": d.created_at,
            "delivered_at": d.delivered_at, "log": d.log, "payload": d.payload}


def get_endpoint(session: Session, tenant: str, endpoint_id: str) -> WebhookEndpoint:
    endpoint = session.get(WebhookEndpoint, endpoint_id)
    if endpoint is None or endpoint.tenant != tenant:
        raise not_found(f"webhook endpoint {endpoint_id!r}")
    return endpoint


@router.post("", status_code=201, response_model=WebhookOut)
@transactional
def create_endpoint(body: WebhookCreate, request: Request, who: Principal = Depends(require("admin")),
                    session: Session = INJECTED, idempotency_key: str | None = Header(None)):
    """Register an endpoint: every event it subscribes to (default all) is POSTed to it, signed with the secret
    this answer shows once (verify with any Standard Webhooks library: the HMAC over id.timestamp.body, a
    timestamp within 5 minutes, and each webhook-id once)."""
    def create():
        settings = get_settings()
        lock_tenant(session, who.tenant, ENDPOINTS_LOCK)
        active = session.scalar(select(func.count()).select_from(WebhookEndpoint).where(
            WebhookEndpoint.tenant == who.tenant, WebhookEndpoint.disabled_at.is_(None))) or 0
        if active >= settings.max_webhook_endpoints:
            raise Problem(409, "too-many-endpoints", "Too many webhook endpoints",
                          f"this tenant has {active} webhook endpoints, the most it may have "
                          "(LETHE_MAX_WEBHOOK_ENDPOINTS); delete one first")
        endpoint = WebhookEndpoint(tenant=who.tenant, url=webhooks.check_url(body.url, settings.webhook_allow_private),
                                   events=webhooks.check_events(body.events), description=body.description,
                                   secret=webhooks.new_secret())
        session.add(endpoint)
        session.flush()
        audit_log.append(session, who.tenant, "webhook.created", endpoint.id,
                         {"url": endpoint.url, "events": endpoint.events, "by": who.key_id})
        return 201, endpoint_out(endpoint, endpoint.secret), f"/v1/webhooks/{endpoint.id}"

    return idempotent(session, who, request, idempotency_key, body.model_dump(mode="json"), create)


@router.get("", response_model=Page)
@transactional
def list_endpoints(who: Principal = Depends(require("jobs:read")), session: Session = INJECTED,
                   page_size: int = Query(50, ge=1, le=500), page_token: str | None = None):
    """The tenant's endpoints, newest first (never their secrets)."""
    query = select(WebhookEndpoint).where(WebhookEndpoint.tenant == who.tenant)
    rows, token = paginate(session, query, WebhookEndpoint, page_size, page_token)
    return {"items": [endpoint_out(e) for e in rows], "next_page_token": token}


@router.get("/{endpoint_id}", response_model=WebhookOut)
@transactional
def read_endpoint(endpoint_id: str, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """One endpoint."""
    return endpoint_out(get_endpoint(session, who.tenant, endpoint_id))


@router.delete("/{endpoint_id}", response_model=WebhookOut)
@transactional
def delete_endpoint(endpoint_id: str, who: Principal = Depends(require("admin")), session: Session = INJECTED):
    """Stop delivering to an endpoint (its log stays; deliveries not yet made end as DEAD)."""
    endpoint = get_endpoint(session, who.tenant, endpoint_id)
    if endpoint.disabled_at is None:
        endpoint.disabled_at = utcnow()
        audit_log.append(session, who.tenant, "webhook.deleted", endpoint.id, {"by": who.key_id})
    session.commit()
    return endpoint_out(endpoint)


@router.post("/{endpoint_id}:rotate-secret", response_model=WebhookOut)
@transactional
def rotate_secret(endpoint_id: str, who: Principal = Depends(require("admin")), session: Session = INJECTED):
    """A new secret, shown once; deliveries carry both signatures until previous_secret_valid_until (by default a
    day), so receivers can switch without a gap."""
    endpoint = get_endpoint(session, who.tenant, endpoint_id)
    if endpoint.disabled_at is not None:
        raise Problem(409, "webhook-deleted", "Webhook deleted", f"endpoint {endpoint_id} was deleted")
    secret = webhooks.rotate(endpoint, get_settings().webhook_rotation_grace_seconds)
    audit_log.append(session, who.tenant, "webhook.secret_rotated", endpoint.id, {"by": who.key_id})
    session.commit()
    return endpoint_out(endpoint, secret)


@router.get("/{endpoint_id}/deliveries", response_model=Page)
@transactional
def list_deliveries(endpoint_id: str, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED,
                    state: str | None = Query(None, pattern="^(PENDING|DELIVERED|DEAD)$"),
                    page_size: int = Query(50, ge=1, le=500), page_token: str | None = None):
    """The endpoint's delivery log, newest first: each event, its state, and every attempt (when, status or
    error, milliseconds)."""
    endpoint = get_endpoint(session, who.tenant, endpoint_id)
    query = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id)
    if state is not None:
        query = query.where(WebhookDelivery.state == state)
    rows, token = paginate(session, query, WebhookDelivery, page_size, page_token)
    return {"items": [delivery_out(d) for d in rows], "next_page_token": token}


@router.post("/{endpoint_id}/deliveries/{delivery_id}:redeliver", response_model=DeliveryOut)
@transactional
def redeliver(endpoint_id: str, delivery_id: str, who: Principal = Depends(require("admin")),
              session: Session = INJECTED):
    """Send a delivery again (a DEAD one too), with the same webhook-id and a fresh budget of attempts."""
    endpoint = get_endpoint(session, who.tenant, endpoint_id)
    delivery = session.get(WebhookDelivery, delivery_id)
    if delivery is None or delivery.endpoint_id != endpoint.id:
        raise not_found(f"delivery {delivery_id!r} of webhook endpoint {endpoint_id!r}")
    if endpoint.disabled_at is not None:
        raise Problem(409, "webhook-deleted", "Webhook deleted", f"endpoint {endpoint_id} was deleted")
    webhooks.redeliver(delivery)
    audit_log.append(session, who.tenant, "webhook.redelivered", delivery.id, {"by": who.key_id})
    session.commit()
    return delivery_out(delivery)
