"""RFC 9457 problem+json answers, each with a stable `type` per error kind."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPE_BASE = "https://lethe.dev/problems/"
MEDIA_TYPE = "application/problem+json"


class Problem(Exception):
    def __init__(self, status: int, kind: str, title: str, detail: str | None = None, *,
                 headers: dict | None = None, **extra):
        super().__init__(detail or title)
        self.status, self.kind, self.title, self.detail, self.extra = status, kind, title, detail, extra
        self.headers = headers or {}

    def body(self, instance: str | None = None) -> dict:
        body = {"type": TYPE_BASE + self.kind, "title": self.title, "status": self.status}
        if self.detail:
            body["detail"] = self.detail
        if instance:
            body["instance"] = instance
        return {**body, **self.extra}


def problem_response(problem: Problem, instance: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(problem.body(instance), status_code=problem.status, media_type=MEDIA_TYPE, headers=headers)


def not_found(what: str) -> Problem:
    return Problem(404, "not-found", "Not found", f"{what} does not exist")


def invalid(detail: str, field: str | None = None) -> Problem:
    extra: dict[str, Any] = {"errors": [{"field": field, "message": detail}]} if field else {}
    return Problem(422, "invalid-request", "Invalid request", detail, **extra)


HTTP_KINDS = {401: ("unauthenticated", "Unauthenticated"), 403: ("forbidden", "Forbidden"),
              404: ("not-found", "Not found"), 405: ("method-not-allowed", "Method not allowed"),
              413: ("payload-too-large", "Payload too large"),
              415: ("unsupported-media-type", "Unsupported media type")}


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem):
        headers = {**exc.headers, **({"WWW-Authenticate": "Bearer"} if exc.status == 401 else {})}
        return problem_response(exc, request.url.path, headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return problem_response(Problem(400, "malformed-json", "Malformed JSON",
                                            "the request body is not valid JSON"), request.url.path)
        listed = [{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body"), "message": e.get("msg")}
                  for e in errors]
        detail = "; ".join(f"{e['field'] or 'body'}: {e['message']}" for e in listed)
        return problem_response(Problem(422, "invalid-request", "Invalid request", detail, errors=listed),
                                request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind, title = HTTP_KINDS.get(exc.status_code, ("http-error", "HTTP error"))
        detail = exc.detail if isinstance(exc.detail, str) else None
        return problem_response(Problem(exc.status_code, kind, title, detail), request.url.path)
