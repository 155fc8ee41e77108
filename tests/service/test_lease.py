"""The database lease: a duplicate or redelivered message never runs a job twice; a job whose worker
died is taken over, re-sent by the sweeper, and FAILED with the reason after max_attempts."""
from datetime import timedelta

import pytest

from lethe.service.domain.jobs import acquire_lease, forget_evidence, jobs_to_resend
from lethe.service.domain.sweeper import sweep_once
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Job, new_id, utcnow
from lethe.worker.runner import run

RECORDS = [{"id": "r1", "prompt": "Q", "completion": "A"}]


def make_job(model_id: str, **fields) -> str:
    with session_scope() as session:
        records = fields.pop("forget_records", RECORDS)
        job = Job(id=new_id("job"), tenant="default", model_id=model_id, base_version=1, request_id="lease-test",
                  method="masc", params={}, forget_records=records, forget_evidence=forget_evidence(records),
                  progress={}, max_attempts=3, cancel_requested=False, **{"state": "QUEUED", "attempt": 0, **fields})
        session.add(job)
        return job.id


def read(job_id: str) -> Job:
    with session_scope() as session:
        return session.get(Job, job_id)


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cancel_leftovers")]


def test_a_finished_job_is_not_run_again(registered_model):
    job_id = make_job(registered_model["id"], state="SUCCEEDED", attempt=1)
    assert run(job_id) == "skipped"
    assert read(job_id).state == "SUCCEEDED" and read(job_id).attempt == 1


def test_a_job_with_a_live_lease_is_left_to_its_worker(registered_model):
    live = utcnow() + timedelta(minutes=5)
    job_id = make_job(registered_model["id"], state="RUNNING", attempt=1, lease_owner="other:1", lease_expires_at=live)
    assert run(job_id) == "skipped"
    job = read(job_id)
    assert (job.state, job.attempt, job.lease_owner) == ("RUNNING", 1, "other:1")


def test_an_expired_lease_is_taken_over_once(registered_model):
    expired = utcnow() - timedelta(seconds=1)
    job_id = make_job(registered_model["id"], state="RUNNING", attempt=1, lease_owner="dead:1",
                      lease_expires_at=expired)
    with session_scope() as session:
        assert acquire_lease(session, job_id, "new:2", 60)
    with session_scope() as session:
        assert not acquire_lease(session, job_id, "third:3", 60)  # now live again: nobody else gets it
    job = read(job_id)
    assert (job.state, job.attempt, job.lease_owner) == ("RUNNING", 2, "new:2")


def test_attempts_exhausted_ends_failed_with_the_reason(registered_model):
    expired = utcnow() - timedelta(seconds=1)
    job_id = make_job(registered_model["id"], state="RUNNING", attempt=3, lease_owner="dead:1",
                      lease_expires_at=expired)
    assert run(job_id) == "failed: attempts exhausted"
    job = read(job_id)
    assert job.state == "FAILED" and "died during each of 3 attempts" in job.error["detail"]
    assert job.forget_records is None and job.forget_evidence["count"] == 1


def test_sweeper_resends_orphans_once_per_expiry(registered_model):
    # An hour ahead: the sweeper of a live service on the same database (real time) neither finds these jobs' leases
    # expired nor their messages due, so only the calls below send them.
    now = utcnow() + timedelta(hours=1)
    orphan = make_job(registered_model["id"], state="RUNNING", attempt=1, lease_owner="dead:1",
                      lease_expires_at=now - timedelta(seconds=5), enqueued_at=now - timedelta(minutes=1))
    stale = make_job(registered_model["id"], state="QUEUED", enqueued_at=now - timedelta(hours=1))
    fresh = make_job(registered_model["id"], state="QUEUED", enqueued_at=now)
    with session_scope() as session:
        first = jobs_to_resend(session, now - timedelta(minutes=10), now)
    with session_scope() as session:
        second = jobs_to_resend(session, now - timedelta(minutes=10), now + timedelta(seconds=1))
    assert {orphan, stale} <= set(first) and fresh not in first
    assert orphan not in second and stale not in second
    exhausted = make_job(registered_model["id"], state="RUNNING", attempt=3, lease_owner="dead:1",
                         lease_expires_at=utcnow() - timedelta(seconds=5))
    sweep_once()
    assert read(exhausted).state == "FAILED"


def test_a_job_past_its_wall_clock_limit_is_stopped_and_fails(client, fixture_model, forget_records, monkeypatch):
    """Issue 26: LETHE_MAX_JOB_SECONDS. A run past it stops at the next heartbeat and ends FAILED (time-limit), no
    version made; a job delivered again after its worker was killed at the limit ends FAILED at once."""
    from lethe.engine.job_spec import JobSpec
    from lethe.service.infra.tables import ModelVersion
    from tests.live_service import clear_caches
    from tests.service.helpers import register

    registered_model = register(client, str(fixture_model)).json()  # its own: other tests leave jobs running
    # Started two days ago (a worker killed at the limit, the message delivered again): no new attempt runs.
    stale = make_job(registered_model["id"], state="QUEUED", attempt=1, started_at=utcnow() - timedelta(days=2))
    assert run(stale) == "failed: time limit"
    job = read(stale)
    assert job.state == "FAILED" and job.error["type"].endswith("/time-limit")

    monkeypatch.setenv("LETHE_MAX_JOB_SECONDS", "3")
    clear_caches()
    try:
        # A run that would go on for a long while (a learning rate that moves nothing): stopped after about 3 s.
        spec = JobSpec.unlearning("masc", {"lr": 1e-12, "max_steps": 100000}).stored()
        with session_scope() as session:
            versions = session.query(ModelVersion).filter_by(model_id=registered_model["id"]).count()
        slow = make_job(registered_model["id"], spec=spec, forget_records=forget_records[:4])
        assert run(slow) == "failed"
        job = read(slow)
        assert job.state == "FAILED" and job.error["type"].endswith("/time-limit"), job.error
        assert 3 <= (job.ended_at - job.started_at).total_seconds() < 60
        with session_scope() as session:
            assert session.query(ModelVersion).filter_by(model_id=registered_model["id"]).count() == versions
    finally:
        monkeypatch.delenv("LETHE_MAX_JOB_SECONDS")
        clear_caches()
