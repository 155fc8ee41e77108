"""Mode connectivity in the database (SPEC section 6): the versions a request's curves run against, storing
each measured curve, and its API view."""
from __future__ import annotations

from sqlalchemy.orm import Session

from lethe.service.domain import lineage
from lethe.service.domain.errors import invalid, not_found
from lethe.service.infra.tables import Connectivity, Job, Model


def resolve_against(session: Session, model: Model, base_number: int, against: list) -> list[int]:
    """'parent' is the job's base version (the new version's parent); numbers must name READY versions."""
    numbers: list[int] = []
    for entry in against:
        number = base_number if entry == "parent" else entry
        try:
            lineage.get_version(session, model, number)
        except Exception:
            raise invalid(f"mcu.against: model {model.id!r} has no version {number}", "mcu.against") from None
        if number not in numbers:
            numbers.append(number)
    return numbers


def store_curve(session: Session, job: Job, a: int, b: int, result: dict, ensemble: dict | None) -> Connectivity:
    details = {k: result[k] for k in ("space", "differing_tensors", "differing_parameters", "counts", "params",
                                      "timing", "line", "versions", "note", "suppress_points") if k in result}
    if "fit" in result:
        details["fit"] = result["fit"]
    row = Connectivity(tenant=job.tenant, model_id=job.model_id, job_id=job.id, version_a=a, version_b=b,
                       curve=result["curve"], mcu_holds=result["barriers"]["mcu_holds"],
                       barriers=result["barriers"], points=result["points"],
                       suppress_first=result.get("suppress_first"), ensemble=ensemble, details=details)
    session.add(row)
    session.flush()
    return row


def view(row: Connectivity) -> dict:
    return {"id": row.id, "model_id": row.model_id, "job_id": row.job_id, "a": row.version_a, "b": row.version_b,
            "curve": row.curve, "mcu_holds": row.mcu_holds, "barriers": row.barriers, "points": row.points,
            "suppress_first": row.suppress_first, "ensemble": row.ensemble, "details": row.details,
            "created_at": row.created_at}


def summary(row: Connectivity) -> dict:
    """What a report carries of one curve: enough to draw it and to state the barriers."""
    b = row.barriers
    return {"id": row.id, "a": row.version_a, "b": row.version_b, "curve": row.curve, "mcu_holds": row.mcu_holds,
            "tolerance": b["tolerance"], "b_retain": b["retain"].get("value"), "b_forget": b["forget"].get("value"),
            "points": row.points, "line": row.details.get("line"), "suppress_first": row.suppress_first,
            "ensemble": row.ensemble, "reason": b.get("reason")}


def get_curve(session: Session, tenant: str, model_id: str, curve_id: str) -> Connectivity:
    row = session.get(Connectivity, curve_id)
    if row is None or row.tenant != tenant or row.model_id != model_id:
        raise not_found(f"connectivity result {curve_id!r} of model {model_id!r}")
    return row
