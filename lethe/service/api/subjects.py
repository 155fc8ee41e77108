"""/v1/subjects/{subject}: what has been erased of one data subject, and which versions still hold its data."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Path
from sqlalchemy.orm import Session

from lethe.service.api.auth import Principal, require
from lethe.service.api.schemas import PLAIN, SubjectLookup, SubjectOut
from lethe.service.domain.subjects import subject_view
from lethe.service.infra.db import INJECTED, transactional

router = APIRouter(prefix="/v1/subjects", tags=["data subjects"])


@router.post(":lookup", response_model=SubjectOut)
@transactional
def lookup_subject(body: SubjectLookup, who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """As GET /v1/subjects/{subject}, with the id in the body: it stays out of URLs and access logs, and may hold
    any character (a "/" included)."""
    return subject_view(session, who.tenant, body.subject)


@router.get("/{subject}", response_model=SubjectOut)
@transactional
def read_subject(subject: str = Path(min_length=1, max_length=256, pattern=PLAIN),
                 who: Principal = Depends(require("jobs:read")), session: Session = INJECTED):
    """The deletion requests that named this subject (by its opaque id), each with its state, the version it made
    and its verdict; per model, whether the subject is erased, in which versions, and which versions predate the
    erasure (the versions a deployment must stop serving). A subject never named answers empty lists."""
    return subject_view(session, who.tenant, subject)
