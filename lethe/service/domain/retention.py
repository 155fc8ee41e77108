"""What is kept for a while and then scrubbed (issue 26): a report's quoted examples, replaced by their sha256 once
LETHE_EXAMPLES_RETENTION_SECONDS have passed since the report was written. The sweeper calls this."""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.service.domain.report_examples import has_examples, scrubbed
from lethe.service.infra.tables import Job

BATCH = 100  # reports per sweep: a backlog is worked off over several sweeps, never in one long transaction


def examples_until(report: dict, retention_seconds: float, now: datetime) -> datetime | None:
    """When a just-written report's examples are due to go (None: it quotes none)."""
    return now + timedelta(seconds=retention_seconds) if has_examples(report) else None


def scrub_expired_examples(session: Session, now: datetime) -> list[str]:
    """Replace the examples of every report past its time by their hashes; the job ids done."""
    jobs = session.scalars(select(Job).where(Job.examples_until.is_not(None), Job.examples_until <= now)
                           .order_by(Job.examples_until).limit(BATCH).with_for_update(skip_locked=True)).all()
    for job in jobs:
        if job.report is not None:
            job.report = {**scrubbed(job.report), "examples_scrubbed_at": now.isoformat()}
        job.examples_until = None
    return [job.id for job in jobs]
