"""RFC 9457 problem+json answers, each with a stable `type` per error kind: the one place where the domain's
errors (lethe.service.domain.errors.Problem) and the engine's refusals of bad input (EngineInputError) become HTTP."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lethe.engine.contract.errors import EngineInputError
from lethe.service.domain.errors import Problem, invalid

MEDIA_TYPE = "application/problem+json"


def problem_response(problem: Problem, instance: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(problem.body(instance), status_code=problem.status, media_type=MEDIA_TYPE, headers=headers)


HTTP_KINDS = {401: ("unauthenticated", "Unauthenticated"), 403: ("forbidden", "Forbidden"),
              404: ("not-found", "Not found"), 405: ("method-not-allowed", "Method not allowed"),
              413: ("payload-too-large", "Payload too large"),
              415: ("unsupported-media-type", "Unsupported media type")}


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem):
        headers = {**exc.headers, **({"WWW-Authenticate": "Bearer"} if exc.status == 401 else {})}
        return problem_response(exc, request.url.path, headers or None)

    @app.exception_handler(EngineInputError)
    async def _engine_input(request: Request, exc: EngineInputError):
        # The engine's own rules refused a record or parameter; its field says where it sits in the body.
        return problem_response(invalid(str(exc), exc.field), request.url.path)

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
