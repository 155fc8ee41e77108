"""Data subjects (issue 14): a deletion request may name the subjects it concerns (opaque ids, kept only as
hashes). For a subject the service answers which requests erased it, on which models and versions, when and with
which verdict, which versions of those models still predate the erasure and are served (the versions a deployment
must stop serving: retire or purge them), and which predating versions were retired or purged."""
from __future__ import annotations

import hashlib

from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.service.domain.digests import current_key, rekey
from lethe.service.domain.lineage import PURGED, RETIRED, SERVED
from lethe.service.infra.tables import ErasureSubject, Job, Model, ModelVersion


def subject_sha256(tenant: str, subject: str) -> str:
    """The plain sha256 of a tenant's subject id: what the keyed hash is taken of (never stored)."""
    return hashlib.sha256(f"{tenant}\x00{subject}".encode("utf-8", "surrogatepass")).hexdigest()


def subject_hmac(tenant: str, subject: str) -> str:
    """What the service keeps of a subject id: a keyed hash (lethe.service.domain.digests), which an e-mail list cannot
    be checked against without the key."""
    return rekey(subject_sha256(tenant, subject), current_key())


def record_subjects(session: Session, job: Job, subjects: list[str]) -> int:
    """The request's subjects, stored with its job as keyed hashes (each once); how many. The audit log and webhooks
    get the count only."""
    hashes = list(dict.fromkeys(subject_hmac(job.tenant, s) for s in subjects))
    session.add_all(ErasureSubject(tenant=job.tenant, subject_hmac=h, job_id=job.id) for h in hashes)
    return len(hashes)


def _request(job: Job) -> dict:
    verdict = (job.report or {}).get("verdict")
    return {"request_id": job.request_id, "job_id": job.id, "model_id": job.model_id, "state": job.state,
            "created_at": job.created_at, "ended_at": job.ended_at,
            "version": (job.result or {}).get("model_version") if job.state == "SUCCEEDED" else None,
            "verdict": {"forgotten": verdict["forgotten"], "summary": verdict["summary"]} if verdict else None}


def subject_view(session: Session, tenant: str, subject: str) -> dict:
    """Every request of the tenant that named the subject, and per model: whether its head holds every erasure of
    the subject that succeeded, in which versions they were made, and which versions do not hold them all."""
    digest = subject_hmac(tenant, subject)
    jobs = session.scalars(select(Job).join(ErasureSubject, ErasureSubject.job_id == Job.id)
                           .where(ErasureSubject.tenant == tenant, ErasureSubject.subject_hmac == digest)
                           .order_by(Job.created_at)).all()
    models = []
    for model_id in dict.fromkeys(j.model_id for j in jobs):
        model = session.get_one(Model, model_id)
        done = {j.request_id: j for j in jobs if j.model_id == model_id and j.state == "SUCCEEDED"}
        every = session.scalars(select(ModelVersion).where(ModelVersion.model_id == model_id)
                                .order_by(ModelVersion.number)).all()
        versions = [v for v in every if v.state == SERVED]
        holding = [v.number for v in versions if done and set(done) <= set(v.erased_request_ids or [])]
        predating = [v for v in every if done and not set(done) <= set(v.erased_request_ids or [])]
        models.append({
            "model_id": model_id, "name": model.name, "erased": bool(done) and bool(holding),
            "erased_in": [{"request_id": rid, "version": (j.result or {}).get("model_version")}
                          for rid, j in done.items()],
            "versions_holding_erasure": holding,
            # Versions that still carry the subject's data and are served: every served version without all of its
            # erasures (retire or purge them); those already out of service, by how.
            "versions_predating_erasure": [v.number for v in predating if v.state == SERVED],
            "versions_predating_retired": [v.number for v in predating if v.state == RETIRED],
            "versions_predating_purged": [v.number for v in predating if v.state == PURGED],
            "pending_requests": [j.request_id for j in jobs if j.model_id == model_id
                                 and j.state in ("QUEUED", "RUNNING", "CANCELLING")]})
    return {"subject": subject, "requests": [_request(j) for j in jobs], "models": models}
