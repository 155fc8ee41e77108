"""The FastAPI application: routes, problem+json errors, body limits, metrics, the sweeper."""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service import problems
from service.api import audit, connectivity, jobs, models, ops
from service.auth import ensure_admin_key
from service.db import session_scope
from service.problems import Problem, problem_response
from service.settings import get_settings
from service.sweeper import Sweeper

log = logging.getLogger("lethe.api")


class BodyLimit:
    """413 for bodies above LETHE_MAX_BODY_BYTES, by Content-Length or by counting a chunked stream."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = Problem(413, "payload-too-large", "Payload too large", f"the body exceeds {self.limit} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await problem_response(too_large, scope["path"])(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise Problem(413, "payload-too-large", "Payload too large", f"the body exceeds {self.limit} bytes")
            return message

        return await self.app(scope, counted, send)


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

    app.add_middleware(BodyLimit, limit=get_settings().max_body_bytes)
    app.add_middleware(Timing)
    return app


app = create_app()
