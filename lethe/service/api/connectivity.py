"""/v1/models/{model_id}/connectivity: a connectivity job between two versions, and the stored curves."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Header, Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.engine.contract.errors import EngineInputError
from lethe.engine.job_spec import JobSpec
from lethe.service.api.auth import Principal, require
from lethe.service.api.idempotency import idempotent
from lethe.service.api.jobs import checked_records, send
from lethe.service.api.pagination import paginate
from lethe.service.api.schemas import ConnectivityCreate, ConnectivityOut, JobOut, Page
from lethe.service.domain import connectivity, lineage
from lethe.service.domain.errors import invalid
from lethe.service.domain.jobs import check_quota, job_view, log_state, new_job
from lethe.service.infra.db import INJECTED, transactional
from lethe.service.infra.tables import Connectivity
from lethe.service.settings import get_settings

router = APIRouter(prefix="/v1/models", tags=["connectivity"])


@router.post("/{model_id}/connectivity", status_code=202, response_model=JobOut)
@transactional
def submit(model_id: str, body: ConnectivityCreate, request: Request, who: Principal = Depends(require("jobs:write")),
           session: Session = INJECTED, idempotency_key: str | None = Header(None)):
    """Measure the curve between versions a and b of a model as a job of its own (kind `connectivity`), followed at
    /v1/unlearning-jobs/{id}."""
    def create():
        settings = get_settings()
        check_quota(session, who.tenant, settings)
        model = lineage.get_model(session, who.tenant, model_id)
        options = body.model_dump(exclude={"forget"})
        try:
            spec = JobSpec.curve(body.engine_values(), model.format)
        except EngineInputError as exc:
            raise EngineInputError(str(exc), field=exc.field and body.body_field(exc.field)) from None
        forget = checked_records(body.forget, "forget", settings.max_records) if body.forget else []
        if body.a == body.b:
            raise invalid("a and b name the same version; a curve needs two", "b")
        for field, number in (("a", body.a), ("b", body.b)):
            try:
                lineage.get_version(session, model, number)
            except Exception:
                raise invalid(f"{field}: model {model.id!r} has no version {number}", field) from None
        job = new_job(who.tenant, model, spec, kind="connectivity", base_version=body.a,
                      request_id=f"connectivity v{body.a}-v{body.b}", forget=forget, retain=model.retain_records,
                      max_attempts=settings.max_attempts, mcu_options=options)
        session.add(job)
        session.flush()
        log_state(job, {"kind": "connectivity", "a": body.a, "b": body.b, "curve": body.curve,
                        "forget": job.forget_evidence["manifest_sha256"], "count": len(forget)})
        return 202, job_view(job), f"/v1/unlearning-jobs/{job.id}"

    return idempotent(session, who, request, idempotency_key, body.model_dump(mode="json"), create, after_commit=send)


@router.get("/{model_id}/connectivity", response_model=Page)
@transactional
def list_curves(model_id: str, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED,
                page_size: int = Query(50, ge=1, le=500), page_token: str | None = None):
    """A model's measured connectivity curves, paginated."""
    model = lineage.get_model(session, who.tenant, model_id)
    query = select(Connectivity).where(Connectivity.tenant == who.tenant, Connectivity.model_id == model.id)
    rows, token = paginate(session, query, Connectivity, page_size, page_token)
    return {"items": [connectivity.view(r) for r in rows], "next_page_token": token}


@router.get("/{model_id}/connectivity/{curve_id}", response_model=ConnectivityOut)
@transactional
def read_curve(model_id: str, curve_id: str, who: Principal = Depends(require("jobs:read")),
               session: Session = INJECTED):
    """One curve: its points, barriers, suppress-first analysis and ensemble."""
    return connectivity.view(connectivity.get_curve(session, who.tenant, model_id, curve_id))
