"""Issue 12, what a crash and a careless operator found: states are compare-and-set, versions are numbered
under a lock, lineage keeps erasures, keys can be listed, revoked and rotated, tenants have quotas, erased
text leaves no bytes behind."""
import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, text

from lethe.service.domain.errors import Problem
from lethe.service.domain.jobs import StateChanged, end_job, fail_exhausted, request_cancel
from lethe.service.domain.lineage import NOT_FORGOTTEN, add_version, get_version, head_version, missing_erasures
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Job, Model, ModelVersion, utcnow
from tests.live_service import ADMIN_KEY, auth
from tests.service.helpers import register
from tests.service.test_lease import make_job, read

PROBLEM = "application/problem+json"
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cancel_leftovers")]


# --- state ---------------------------------------------------------------------------------------------

def test_a_cancel_that_arrives_as_the_worker_finishes_leaves_it_succeeded(registered_model):
    job_id = make_job(registered_model["id"], state="RUNNING", attempt=1, lease_owner="w:1",
                      lease_expires_at=utcnow() + timedelta(minutes=5))
    with session_scope() as api:
        stale = api.get(Job, job_id)  # the API read RUNNING ...
        with session_scope() as worker:  # ... the worker ends it in between ...
            end_job(worker.get(Job, job_id), "SUCCEEDED", result={"model_version": 2})
        with pytest.raises(Problem) as refused:  # ... the cancel does not turn it back
            request_cancel(api, stale)
        assert refused.value.status == 409
    assert (read(job_id).state, read(job_id).lease_owner) == ("SUCCEEDED", None)


def test_the_sweeper_does_not_fail_a_job_its_worker_just_finished(registered_model):
    job_id = make_job(registered_model["id"], state="RUNNING", attempt=3, lease_owner="slow:1",
                      lease_expires_at=utcnow() - timedelta(seconds=1))
    with session_scope() as sweeper:
        stale = sweeper.get(Job, job_id)
        assert stale.state == "RUNNING"
        with session_scope() as worker:
            end_job(worker.get(Job, job_id), "SUCCEEDED", result={"model_version": 2})
        assert not fail_exhausted(sweeper, job_id)
    assert read(job_id).state == "SUCCEEDED"


def test_a_transition_from_a_state_the_job_left_raises(registered_model):
    job_id = make_job(registered_model["id"], state="SUCCEEDED", attempt=1)
    with session_scope() as session:
        job = session.get(Job, job_id)
        with pytest.raises(StateChanged):
            end_job(job, "FAILED", expected=("RUNNING",), error={"detail": "late"})


def test_two_versions_finishing_together_get_consecutive_numbers(registered_model):
    """PostgreSQL: the second transaction waits for the model's row lock instead of failing the unique
    constraint with the same number."""
    numbers, errors = [], []

    def add(session, tag):
        model = session.get(Model, registered_model["id"])
        version = add_version(session, model, location="nowhere", manifest=[], parent=None, job_id=None,
                              request_id=None, tags=[tag])
        numbers.append(version.number)

    def second():
        try:
            with session_scope() as session:
                add(session, "second")
        except Exception as exc:  # noqa: BLE001 (the assertion below names it)
            errors.append(exc)

    with session_scope() as session:
        add(session, "first")
        other = threading.Thread(target=second)
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive()  # waiting on the lock, not failed
    other.join(timeout=30)
    assert not errors and numbers[1] == numbers[0] + 1, (numbers, errors)
    with session_scope() as session:  # tidy: these versions point nowhere
        session.query(ModelVersion).filter(ModelVersion.model_id == registered_model["id"],
                                           ModelVersion.number.in_(numbers)).delete()


def test_the_head_holds_every_erasure_and_an_ensemble_with_an_older_version_is_not_it(client, fixture_model):
    model_id = register(client, str(fixture_model)).json()["id"]
    with session_scope() as session:
        model = session.get(Model, model_id)
        v1 = get_version(session, model, 1)
        v2 = add_version(session, model, location=v1.location, manifest=v1.manifest, parent=v1, job_id=None,
                         request_id="erase-A")
        # An ensemble of v1 and v2 mixes in v1's weights: it holds only what both hold.
        v3 = add_version(session, model, location=v1.location, manifest=v1.manifest, parent=v2, job_id=None,
                         request_id=None, tags=["mcu-ensemble"], erased=[])
        assert head_version(session, model).number == v2.number
        assert missing_erasures(session, v3) == ["erase-A"] and missing_erasures(session, v1) == ["erase-A"]
        # One that holds every erasure but whose own audit said "Not established" is never the head either.
        v4 = add_version(session, model, location=v1.location, manifest=v1.manifest, parent=v2, job_id=None,
                         request_id=None, tags=["mcu-ensemble", NOT_FORGOTTEN], erased=["erase-A"])
        assert missing_erasures(session, v4) == [] and head_version(session, model).number == v2.number
    assert client.get(f"/v1/models/{model_id}/versions/latest", headers=auth()).json()["number"] == 2
    # A job pinned to a version that predates an erasure would bring the erased data back: refused.
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model_id, "request_id": "erase-B", "version": 1, "forget": [{"prompt": "Q", "completion": "A"}]})
    assert answer.status_code == 409 and "erase-A" in answer.json()["detail"]
    answer = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model_id, "request_id": "erase-B", "forget": [{"prompt": "Q", "completion": "A"}],
        "params": {"max_steps": 1}})
    assert answer.status_code == 202 and answer.json()["base_version"] == 2
    # Not for the worker (this test checks the submission): cancelled in whatever state it has reached.
    assert client.post(f"/v1/unlearning-jobs/{answer.json()['id']}:cancel", headers=auth()).status_code in (200, 409)


# --- keys ----------------------------------------------------------------------------------------------

def test_a_flood_of_unknown_keys_neither_evicts_known_ones_nor_grows_the_cache(client, monkeypatch):
    from lethe.service.api import auth as keys

    monkeypatch.setattr(keys, "KEY_CACHE_LIMIT", 20)
    # Eviction, not expiry, is what this checks: 60 lookups took over the 5 s lifetime on a slow CI machine.
    monkeypatch.setattr(keys, "KEY_CACHE_SECONDS", 3600.0)
    assert keys.lookup(ADMIN_KEY) is not None
    for i in range(60):
        assert keys.lookup(f"lth_made_up_{i}") is None
    assert keys.cached(keys.hash_key(ADMIN_KEY))[0]  # still known here: no query, no eviction
    assert len(keys._unknown) == 20 and keys.cached(keys.hash_key("lth_made_up_59")) == (True, None)
    assert client.get("/v1/models", headers={"Authorization": "Bearer lth_made_up_59"}).status_code == 401


def test_an_event_stream_ends_when_its_key_is_revoked_and_streams_per_key_are_capped(client, registered_model,
                                                                                       monkeypatch):
    from lethe.service.api import jobs as job_api

    job_id = make_job(registered_model["id"])  # QUEUED, never sent: its stream would run until the job ends
    minted = client.post("/v1/api-keys", headers=auth(), json={"tenant": "default", "scopes": ["jobs:read"],
                                                               "name": "streamer"}).json()
    seen: list[str] = []

    def follow():
        with client.stream("GET", f"/v1/unlearning-jobs/{job_id}/events", headers=auth(minted["key"])) as stream:
            seen.extend(line for line in stream.iter_lines() if line.startswith("event:"))

    monkeypatch.setattr(job_api, "MAX_STREAMS_PER_KEY", 1)
    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        for _ in range(100):  # the stream is open once the process counts it
            if job_api._streams.get(minted["id"]):
                break
            threading.Event().wait(0.05)
        second = client.get(f"/v1/unlearning-jobs/{job_id}/events", headers=auth(minted["key"]))
        assert second.status_code == 429 and second.json()["type"].endswith("too-many-streams")
        assert client.delete(f"/v1/api-keys/{minted['id']}", headers=auth()).status_code == 200
        follower.join(10)
        assert not follower.is_alive(), "the stream outlived its key's revocation"
        assert seen[-1] == "event: error" and minted["id"] not in job_api._streams
    finally:
        with session_scope() as session:
            end_job(session.get(Job, job_id), "CANCELLED")


def test_keys_are_listed_revoked_at_once_and_tenant_admins_stay_in_their_tenant(client):
    from lethe.service.infra.tables import AuditEntry

    tenant = "t-" + uuid.uuid4().hex[:6]
    minted = client.post("/v1/api-keys", headers=auth(), json={"tenant": tenant, "scopes": ["admin"], "name": "ta"})
    assert minted.status_code == 201
    tenant_admin, admin_id = minted.json()["key"], minted.json()["id"]
    with session_scope() as session:  # the log says which key minted it
        entry = session.scalar(select(AuditEntry).where(AuditEntry.subject == admin_id,
                                                        AuditEntry.kind == "key.created"))
        assert entry.data["by"] and entry.data["by"] != admin_id
    # A tenant's admin: keys of its own tenant only, and no admin keys.
    for body in ({"tenant": "default", "scopes": ["jobs:read"]}, {"tenant": tenant, "scopes": ["admin"]}):
        assert client.post("/v1/api-keys", headers=auth(tenant_admin), json=body).status_code == 403
    reader = client.post("/v1/api-keys", headers=auth(tenant_admin), json={"tenant": tenant, "scopes": ["jobs:read"]})
    assert reader.status_code == 201
    listed = client.get("/v1/api-keys", headers=auth(tenant_admin)).json()["items"]
    assert {k["tenant"] for k in listed} == {tenant} and {k["id"] for k in listed} == {admin_id, reader.json()["id"]}
    assert all("key" not in k or k["key"] is None for k in listed)
    # Revoked: refused at once on this process (the next request, not 5 s later).
    key = reader.json()["key"]
    assert client.get("/v1/unlearning-jobs", headers=auth(key)).status_code == 200
    assert client.delete(f"/v1/api-keys/{reader.json()['id']}", headers=auth(tenant_admin)).json()["revoked_at"]
    assert client.get("/v1/unlearning-jobs", headers=auth(key)).status_code == 401
    # Every tenant's job counts are not a tenant's, not even its admin's, nor can it mint a key to see them.
    assert client.get("/metrics", headers=auth(tenant_admin)).status_code == 403
    assert client.post("/v1/api-keys", headers=auth(tenant_admin),
                       json={"tenant": tenant, "scopes": ["metrics:read"]}).status_code == 403
    assert client.get("/metrics", headers=auth()).status_code == 200  # the operator
    # Another tenant's key is not found for a tenant admin.
    others = client.get("/v1/api-keys", headers=auth(), params={"tenant": "default"}).json()["items"]
    assert client.delete(f"/v1/api-keys/{others[0]['id']}", headers=auth(tenant_admin)).status_code == 404


def test_rotating_the_admin_key_revokes_the_old_one(client):
    from lethe.service.api.auth import ensure_admin_key, lookup

    old, new = "lth_rot_" + uuid.uuid4().hex, "lth_rot_" + uuid.uuid4().hex
    with session_scope() as session:
        ensure_admin_key(session, old, "default")
    assert lookup(old) is not None
    with session_scope() as session:
        ensure_admin_key(session, new, "default")
    assert lookup(old) is None and lookup(new) is not None
    # A key revoked through the API (leaked) stays revoked, even when the variable still names it.
    new_id = lookup(new).key_id
    assert client.delete(f"/v1/api-keys/{new_id}", headers=auth(new)).status_code == 200
    with session_scope() as session:  # back to this run's key (revoked by the rotation above, restored)
        ensure_admin_key(session, ADMIN_KEY, "default")
    assert lookup(ADMIN_KEY) is not None and lookup(new) is None
    with session_scope() as session:
        ensure_admin_key(session, new, "default")
    assert lookup(new) is None
    with session_scope() as session:
        ensure_admin_key(session, ADMIN_KEY, "default")
    assert lookup(ADMIN_KEY) is not None


# --- quotas --------------------------------------------------------------------------------------------

def test_parallel_submissions_cannot_pass_the_quota_together(registered_model):
    import time
    from types import SimpleNamespace

    from lethe.service.domain.jobs import check_quota, forget_evidence

    tenant, records = "p-" + uuid.uuid4().hex[:6], [{"id": "r", "prompt": "Q", "completion": "A"}]
    one = SimpleNamespace(max_active_jobs=1, max_worker_seconds_per_day=0)
    counted, outcomes = threading.Event(), []

    def submit(first: bool):
        if not first:
            counted.wait(10)  # the first has counted and not yet inserted
        try:
            with session_scope() as session:
                check_quota(session, tenant, one)
                if first:
                    counted.set()
                    time.sleep(1.0)
                session.add(Job(tenant=tenant, model_id=registered_model["id"], base_version=1, request_id="p",
                                method="masc", params={}, forget_records=records,
                                forget_evidence=forget_evidence(records), progress={}, max_attempts=3,
                                cancel_requested=False, state="QUEUED", attempt=0))
            outcomes.append("in")
        except Problem as problem:
            outcomes.append(problem.status)

    threads = [threading.Thread(target=submit, args=(first,)) for first in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert sorted(outcomes, key=str) == [429, "in"], outcomes  # one job in, the other counted after it
    finally:
        with session_scope() as session:  # leave nothing for the worker
            for job in session.query(Job).filter(Job.tenant == tenant, Job.state == "QUEUED"):
                end_job(job, "CANCELLED")


def test_a_tenant_over_its_quota_gets_429_and_creates_nothing(registered_model):
    from types import SimpleNamespace

    from lethe.service.domain.jobs import check_quota, forget_evidence

    tenant = "q-" + uuid.uuid4().hex[:6]
    records = [{"id": "r", "prompt": "Q", "completion": "A"}]

    def add(**fields):
        with session_scope() as session:
            session.add(Job(tenant=tenant, model_id=registered_model["id"], base_version=1, request_id="q",
                            method="masc", params={}, forget_records=records, forget_evidence=forget_evidence(records),
                            progress={}, max_attempts=3, cancel_requested=False, **{"attempt": 1, **fields}))

    add(state="QUEUED", attempt=0)
    add(state="SUCCEEDED", started_at=utcnow() - timedelta(hours=2), ended_at=utcnow() - timedelta(hours=1))
    with session_scope() as session:
        check_quota(session, tenant, SimpleNamespace(max_active_jobs=2, max_worker_seconds_per_day=0))
        with pytest.raises(Problem) as over:
            check_quota(session, tenant, SimpleNamespace(max_active_jobs=1, max_worker_seconds_per_day=0))
        assert over.value.status == 429 and over.value.headers["Retry-After"]
        # One hour of worker time in the last day: over a half-hour allowance, under two hours.
        check_quota(session, tenant, SimpleNamespace(max_active_jobs=5, max_worker_seconds_per_day=7200))
        with pytest.raises(Problem, match="worker seconds"):
            check_quota(session, tenant, SimpleNamespace(max_active_jobs=5, max_worker_seconds_per_day=1800))
    with session_scope() as session:  # leave nothing for the worker
        for job in session.query(Job).filter(Job.tenant == tenant, Job.state == "QUEUED"):
            end_job(job, "CANCELLED")


# --- erased text on disk -----------------------------------------------------------------------------------

def test_erased_records_leave_no_bytes_in_an_sqlite_file(tmp_path):
    from sqlalchemy.orm import Session

    from lethe.service.domain.jobs import forget_evidence
    from lethe.service.infra.db import make_engine
    from lethe.service.infra.scrub import scrub
    from lethe.service.infra.tables import Base

    marker = "Zorblatt-" + uuid.uuid4().hex  # the erased text
    records = [{"id": "r", "prompt": "Q", "completion": marker * 20}]
    engine = make_engine(f"sqlite:///{tmp_path}/lethe.db")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add(Model(id="mdl_" + "0" * 32, tenant="t", name="m", source="s"))
        session.flush()
        job = Job(tenant="t", model_id="mdl_" + "0" * 32, base_version=1, request_id="r", method="masc", params={},
                  forget_records=records, forget_evidence=forget_evidence(records), progress={}, max_attempts=3,
                  cancel_requested=False, state="RUNNING", attempt=1)
        session.add(job)
        session.commit()
        end_job(job, "SUCCEEDED", result={})
        session.commit()
    assert scrub(engine) == (True, "sqlite: write-ahead log checkpointed and truncated")
    engine.dispose()
    on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert marker.encode() not in on_disk


def test_the_sweeper_vacuums_jobs_on_postgresql_after_jobs_end(registered_model):
    import time

    from lethe.service.domain import sweeper
    from lethe.service.infra.db import get_engine

    def last_vacuum():
        with get_engine().connect() as connection:
            return connection.execute(
                text("SELECT last_vacuum FROM pg_stat_user_tables WHERE relname = 'jobs'")).scalar()

    before = last_vacuum()
    job_id = make_job(registered_model["id"], state="RUNNING", attempt=1, lease_owner="w:1",
                      lease_expires_at=utcnow() + timedelta(minutes=5))
    with session_scope() as session:
        end_job(session.get(Job, job_id), "SUCCEEDED", result={})
    deadline = time.time() + 15
    while True:  # the app's own sweeper thread may get there first; the statistics follow within a second
        done = sweeper.scrub_if_jobs_ended()
        assert done in (None, "postgresql: jobs vacuumed")
        now = last_vacuum()
        if (now is not None and (before is None or now > before)) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert now is not None and (before is None or now > before)
    assert sweeper.scrub_if_jobs_ended() is None  # nothing ended since


def test_a_job_waits_while_another_job_of_its_model_runs_even_with_an_expired_lease(client, fixture_model):
    from lethe.worker.runner import run

    model_id = register(client, str(fixture_model)).json()["id"]
    # A sibling whose lease expired is not known dead: its worker may be slow and still make a version.
    sibling = make_job(model_id, state="RUNNING", attempt=1, lease_owner="slow:1",
                       lease_expires_at=utcnow() - timedelta(seconds=30))
    waiting = make_job(model_id, follows_head=True)
    assert run(waiting) == f"waiting for job {sibling}"
    job = read(waiting)
    assert (job.state, job.attempt) == ("QUEUED", 0) and job.enqueued_at is not None  # the sweeper need not re-send
    with session_scope() as session:  # tidy: neither is for the worker
        end_job(session.get(Job, sibling), "FAILED", error={"detail": "test"})
        end_job(session.get(Job, waiting), "CANCELLED")
