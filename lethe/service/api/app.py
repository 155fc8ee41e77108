"""The FastAPI application: routes, problem+json errors, body limits, metrics, the sweeper."""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from urllib.parse import unquote_to_bytes

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from lethe.service.api import audit, connectivity, jobs, keys, models, ops, problems, subjects, webhooks
from lethe.service.api.auth import cached, ensure_admin_key, hash_key, lookup
from lethe.service.api.problems import problem_response
from lethe.service.domain.errors import Problem
from lethe.service.domain.sweeper import Sweeper
from lethe.service.infra.db import session_scope
from lethe.service.settings import get_settings

log = logging.getLogger("lethe.api")


ANONYMOUS_BODY_BYTES = 64 * 2**10  # what a request without a valid API key may carry (it is refused anyway)
MAX_CONTAINERS = 500_000  # JSON lists and objects in one body: 20,000 records need a small share of it


class BodyLimit:
    """413 for bodies above LETHE_MAX_BODY_BYTES, by Content-Length or by counting a chunked stream. The key is
    checked first: without a valid one a body may hold ANONYMOUS_BODY_BYTES (401 past it), so that no one without a
    key makes the process buffer and parse megabytes. The body is read here, whole, before the app sees it (a limit
    hit inside the app's JSON parsing came back as 400), and one with more than MAX_CONTAINERS lists and objects is
    refused before it is parsed (4 MiB of nested empty lists cost about 100 MiB and 0.6 s of the event loop)."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        limit = self.limit if await _valid_key(headers.get(b"authorization", b"")) else ANONYMOUS_BODY_BYTES
        too_large = Problem(413, "payload-too-large", "Payload too large", f"the body exceeds {limit} bytes") \
            if limit == self.limit else Problem(401, "unauthenticated", "Unauthenticated",
                                                f"a body over {limit} bytes needs a valid API key (Authorization: "
                                                "Bearer <api key>)")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await problem_response(too_large, scope["path"])(scope, receive, send)
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > limit:
                return await problem_response(too_large, scope["path"])(scope, receive, send)
            if not message.get("more_body", False):
                break
        body, delivered = b"".join(chunks), False
        if body.count(b"[") + body.count(b"{") > MAX_CONTAINERS:
            crowded = Problem(413, "payload-too-large", "Payload too large",
                              f"the body holds more than {MAX_CONTAINERS} JSON lists and objects")
            return await problem_response(crowded, scope["path"])(scope, receive, send)

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _valid_key(header: bytes) -> bool:
    """Whether an Authorization header carries a key that is known and not revoked (cached as the app's own check
    caches it, so a valid key costs no query here)."""
    scheme, _, token = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    known, found = cached(hash_key(token.strip()))
    if not known:
        try:
            found = await anyio.to_thread.run_sync(lookup, token.strip())
        except Exception:  # the database unreachable: the small limit, and the app's own check answers
            log.exception("API key lookup failed")
            return False
    return found is not None


class PlainPath:
    """404 for a path or query that holds control characters or undecodable bytes (%00, %ff): no id has
    them, and a NUL would reach the database as a server error."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send):
        if scope["type"] == "http":
            raw = (scope["path"].encode("utf-8", "surrogatepass") + b"?"
                   + unquote_to_bytes(scope.get("query_string", b"")))
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "\x00"
            if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text):
                problem = Problem(404, "not-found", "Not found", "no resource has a name with control characters")
                return await problem_response(problem)(scope, receive, send)
        return await self.app(scope, receive, send)


class Timing:
    """Request latency by method, route template and status, for /metrics (plain ASGI: no extra task)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def record(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            ops.observe(scope["method"], route, status[0], time.perf_counter() - started)


@asynccontextmanager
async def lifespan(app: FastAPI):
    settings = get_settings()
    if settings.admin_key:
        with session_scope() as session:
            ensure_admin_key(session, settings.admin_key, settings.admin_tenant)
    sweeper = Sweeper()
    sweeper.start()
    yield
    sweeper.stop()


def create_app() -> FastAPI:
    app = FastAPI(title="Lethe", version="0.1.0", lifespan=lifespan,
                  description="Machine unlearning as a service: deletion requests in, unlearned model versions "
                              "and audit evidence out.")
    problems.install(app)
    app.include_router(ops.router)
    app.include_router(models.router)
    app.include_router(jobs.router)
    app.include_router(connectivity.router)
    app.include_router(audit.router)
    app.include_router(keys.router)
    app.include_router(subjects.router)
    app.include_router(webhooks.router)

    app.add_middleware(BodyLimit, limit=get_settings().max_body_bytes)
    app.add_middleware(PlainPath)
    app.add_middleware(Timing)
    return app


app = create_app()
