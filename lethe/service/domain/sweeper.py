"""Re-sends jobs whose message may be lost: QUEUED ones not sent for a while (broker down at submit,
a filesystem broker's file lost) and RUNNING ones whose worker stopped renewing its lease. A duplicate
message is harmless: the lease lets only one worker run a job."""
from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import func, select

from lethe.service.domain.jobs import fail_exhausted, jobs_to_resend
from lethe.service.domain.retention import scrub_expired_examples
from lethe.service.infra.db import get_engine, session_scope
from lethe.service.infra.queue import enqueue
from lethe.service.infra.scrub import scrub
from lethe.service.infra.tables import Job, utcnow
from lethe.service.settings import get_settings

log = logging.getLogger("lethe.sweeper")
RESEND_QUEUED_AFTER = timedelta(minutes=10)


_scrubbed_up_to = None  # the latest ended_at already scrubbed (lethe.service.infra.scrub)


def scrub_if_jobs_ended() -> str | None:
    """After jobs end (their forget records set to NULL), clear the database's leftovers of those records."""
    global _scrubbed_up_to
    with session_scope() as session:
        latest = session.scalar(select(func.max(Job.ended_at)))
    if latest is None or (_scrubbed_up_to is not None and latest <= _scrubbed_up_to):
        return None
    done, what = scrub(get_engine())
    if done:  # else the next sweep tries again
        _scrubbed_up_to = latest
    return what


def scrub_examples() -> str | None:
    """Reports past their examples' retention lose the quoted text (lethe.service.domain.retention); the database's
    leftovers of it go too."""
    with session_scope() as session:
        done = scrub_expired_examples(session, utcnow())
    if not done:
        return None
    _, what = scrub(get_engine())
    return f"examples of {len(done)} report(s) replaced by their hashes; {what}"


def sweep_once() -> list[str]:
    now = utcnow()
    with session_scope() as session:
        # Jobs whose every attempt died end FAILED here; the rest are sent again.
        for job_id in session.scalars(Job.__table__.select().with_only_columns(Job.id)
                                      .where(Job.state.in_(("RUNNING", "CANCELLING")), Job.lease_expires_at < now)):
            fail_exhausted(session, job_id)
        due = jobs_to_resend(session, now - RESEND_QUEUED_AFTER, now)
        queues = dict(session.execute(select(Job.id, Job.queue).where(Job.id.in_(due))).tuples().all()) if due else {}
    for job_id in due:
        try:
            enqueue(job_id, queue=queues.get(job_id))
        except Exception:
            log.exception("re-sending job %s failed; next sweep tries again", job_id)
    return due


class Sweeper(threading.Thread):
    def __init__(self):
        super().__init__(name="lethe-sweeper", daemon=True)
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(get_settings().sweep_seconds):
            try:
                if resent := sweep_once():
                    log.warning("re-sent %d job(s): %s", len(resent), resent)
                if scrubbed := scrub_if_jobs_ended():
                    log.info("scrub: %s", scrubbed)
                if examples := scrub_examples():
                    log.info("scrub: %s", examples)
            except Exception:
                log.exception("sweep failed")

    def stop(self):
        self.stopped.set()
