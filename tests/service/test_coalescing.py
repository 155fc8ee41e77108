"""Coalesced runs (issue 28): the queued requests of a model that run the same way join the run of the one that
starts; each keeps its own job, result slice, verdict and report, and one new version holds them all. Against the
real PostgreSQL, Redis and (for the last two) the session's Celery worker process."""
import uuid
from datetime import timedelta

import pytest

from lethe.engine.contract.record_checks import REQUEST, normalise_records
from lethe.engine.job_spec import JobSpec
from lethe.service.domain.jobs import new_job, without_forget
from lethe.service.domain.lineage import get_version
from lethe.service.domain.runs import union_records, union_retain
from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import Job, Model, ModelVersion, utcnow
from lethe.worker.runner import run
from tests.live_service import auth, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cancel_leftovers")]

FAST = {"lr": 1e-3, "max_steps": 1000}
SLOW = {"lr": 1e-9, "max_steps": 100000}  # never meets the rule: runs until cancelled


def queued(model: dict, forget: list[dict], request_id: str, *, params: dict | None = None, coalesce: bool = True,
           **fields) -> str:
    """A job as the API stores it (checked records, the resolved specification, retain less the forget records), not
    sent to the broker: the test runs it in this process, and the sweeper leaves it alone for ten minutes."""
    with session_scope() as session:
        row = session.get_one(Model, model["id"])
        forget = normalise_records(forget, "forget")
        retain, _ = without_forget(row.retain_records, forget)
        job = new_job(row.tenant, row, JobSpec.unlearning("masc", params or FAST, None, None, row.format),
                      request_id=request_id, base_version=get_version(session, row, None).number, follows_head=True,
                      requested=params or FAST, forget=forget, retain=retain, max_attempts=3, coalesce=coalesce)
        job.enqueued_at = utcnow()
        for key, value in fields.items():
            setattr(job, key, value)
        session.add(job)
        return job.id


def read(job_id: str) -> Job:
    with session_scope() as session:
        job = session.get_one(Job, job_id)
        session.expunge(job)
        return job


def renamed(records: list[dict], ids: list[str]) -> list[dict]:
    return [{**r, "id": i} for r, i in zip(records, ids)]


def test_queued_requests_join_one_run_each_with_its_own_result_and_verdict(client, registered_model, people):
    model = registered_model
    leader = queued(model, people[4], "co-leader")
    a = queued(model, people[5], "co-a")
    # Another request whose record ids are a's: ids are the request's own, not the run's.
    b = queued(model, renamed(people[6], [r["id"] for r in people[5]]), "co-b")
    alone = queued(model, people[7], "co-opt-out", coalesce=False)
    other_params = queued(model, people[7], "co-other-params", params={**FAST, "max_steps": 999})
    cancelled = queued(model, people[7], "co-cancelled")
    answer = client.post(f"/v1/unlearning-jobs/{cancelled}:cancel", headers=auth())
    assert answer.json()["state"] == "CANCELLED"

    outcome = run(leader)
    assert outcome.startswith("succeeded"), outcome
    jobs = {j: read(j) for j in (leader, a, b)}
    number = jobs[leader].result["model_version"]
    for job_id, job in jobs.items():
        assert job.state == "SUCCEEDED" and job.run_id == leader, (job_id, job.state, job.error)
        assert job.result["model_version"] == number and job.result["run_id"] == leader
        assert job.forget_records is None  # the records go when each job ends
    with session_scope() as session:
        version = session.query(ModelVersion).filter_by(model_id=model["id"], number=number).one()
        assert {"co-leader", "co-a", "co-b"} <= set(version.erased_request_ids)
        assert not {"co-opt-out", "co-other-params", "co-cancelled"} & set(version.erased_request_ids)
        assert version.job_id == leader
    for job_id in (alone, other_params):
        job = read(job_id)
        assert job.state == "QUEUED" and job.run_id is None
    assert read(cancelled).state == "CANCELLED"

    # Each request's result, report and verdict are its own records' (a and b share ids, not records).
    for job_id, records in ((leader, people[4]), (a, people[5]), (b, people[5])):
        job, own = jobs[job_id], sorted(r["id"] for r in records)
        assert sorted(r["id"] for r in job.engine_result["per_record"]) == own
        assert sorted({r["record"] for r in job.report["verdict"]["records"]}) == own
        assert job.report["evidence"]["request_id"] == job.request_id
        assert job.report["run"]["id"] == leader and len(job.report["run"]["requests"]) == 3
        assert job.report["run"]["forget_records"] == len(people[4]) + len(people[5]) + len(people[6])
        assert "/" not in str(job.report["audit"]["after"]["forget_verbatim"]["exact_match"]["per_record"])
    assert jobs[a].engine_result["per_record"] != jobs[b].engine_result["per_record"]
    view = client.get(f"/v1/unlearning-jobs/{a}", headers=auth()).json()
    assert view["run_id"] == leader and view["result"]["run_id"] == leader and view["coalesce"] is True

    # The request that opted out runs alone, from the run's version.
    assert run(alone).startswith("succeeded")
    job = read(alone)
    assert job.run_id is None and "run_id" not in job.result and job.base_version == number
    assert "run" not in job.report
    # No drift: its retain term anchored to the root, not to the version it started from (the run's anchored to
    # nothing else: it started from the root itself).
    assert job.engine_result["anchor"] == "version 1" and job.report["evidence"]["retain_anchor"] == "version 1"
    assert "anchor" not in jobs[leader].engine_result
    assert jobs[leader].report["evidence"]["retain_anchor"] == "version 1 (the base)"
    assert job.engine_result["peak_memory"]["estimate"]["anchor_copy"] > 0
    # Earlier erasures stay erased: its whitened update was kept off the directions the run's erasure wrote (the
    # erasure guard); the run from the root had nothing to guard.
    assert job.engine_result["lora"]["whitened"]["guarded"]["directions"] > 0
    assert job.engine_result["peak_memory"]["estimate"]["erasure_guard"] > 0
    assert jobs[leader].engine_result["lora"]["whitened"]["guarded"]["directions"] == 0
    client.post(f"/v1/unlearning-jobs/{other_params}:cancel", headers=auth())


def test_a_model_pins_its_anchor_to_a_version_it_keeps(client, registered_model):
    url = f"/v1/models/{registered_model['id']}"
    assert client.get(url, headers=auth()).json()["anchor_version"] == 1  # the root by default
    assert client.patch(url, headers=auth(), json={"anchor_version": 999}).status_code == 404
    assert client.get(url, headers=auth()).json()["anchor_version"] == 1  # a refused change changes nothing
    assert client.patch(url, headers=auth(), json={"anchor_version": 2}).json()["anchor_version"] == 2
    with session_scope() as session:
        assert session.get_one(Model, registered_model["id"]).anchor_version == 2
    assert client.patch(url, headers=auth(), json={"anchor_version": None}).json()["anchor_version"] == 1
    assert client.patch(url, headers=auth(), json={"anchor_version": 0}).status_code == 422


def test_a_run_whose_worker_died_is_taken_over_whole_by_its_first_member_to_arrive(registered_model, people):
    """The members of a run are RUNNING with expired leases after their worker died; none waits for another (that
    would deadlock), the first to arrive takes the others with it."""
    model = registered_model
    dead_run = "job_dead" + uuid.uuid4().hex[:8]
    expired = dict(state="RUNNING", attempt=1, lease_owner="dead:1", lease_expires_at=utcnow() - timedelta(seconds=5),
                   run_id=dead_run)
    first = queued(model, people[4], "co-dead-1", **expired)
    second = queued(model, people[5], "co-dead-2", **expired)
    outcome = run(second)
    assert outcome.startswith("succeeded"), outcome
    for job_id in (first, second):
        job = read(job_id)
        assert job.state == "SUCCEEDED" and job.run_id == second and job.attempt == 2


def test_the_retain_records_of_a_run_are_each_text_once_and_never_a_forget_record():
    one = Job(id="job_1", retain_records=[{"id": "x", "prompt": "Q1", "completion": "A1"},
                                          {"id": "y", "prompt": "Q2", "completion": "A2"}])
    two = Job(id="job_2", retain_records=[{"id": "x", "prompt": "Q1", "completion": " A1 "},
                                          {"id": "z", "prompt": "Q3", "completion": "A3"}])
    forget = [{"id": "job_2/f", "prompt": "Q2", "completion": "A2"}]
    assert [r["id"] for r in union_retain([one, two], forget)] == ["job_1/x", "job_2/z"]


def test_each_forget_record_of_a_run_names_its_request_so_its_answers_are_held_to_that_requests_content():
    one = Job(id="job_1", forget_records=[{"id": "a", "prompt": "Q1", "completion": "A1", "request": "mine"}])
    two = Job(id="job_2", forget_records=[{"id": "a", "prompt": "Q2", "completion": "A2"}])
    union = normalise_records(union_records([one, two], "forget_records"), "forget")  # as the worker reads them
    assert [(r["id"], r[REQUEST]) for r in union] == [("job_1/a", "job_1"), ("job_2/a", "job_2")]


def test_coalescing_through_the_worker_with_opt_out_and_idempotent_resubmission(client, worker, registered_model,
                                                                                people):
    model = registered_model
    blocker = submit(client, model, people[3], "co-blocker", SLOW, coalesce=False)
    wait_for(client, blocker, states=("RUNNING",))
    y = submit(client, model, people[4], "co-y", key="co-y-key")
    z = submit(client, model, people[5], "co-z")
    v = submit(client, model, people[6], "co-v", coalesce=False)
    assert submit(client, model, people[4], "co-y", key="co-y-key") == y  # the same job, not a second one
    client.post(f"/v1/unlearning-jobs/{blocker}:cancel", headers=auth())
    done = {j: wait_for(client, j) for j in (y, z, v)}
    assert all(d["state"] == "SUCCEEDED" for d in done.values()), done
    assert done[y]["run_id"] == done[z]["run_id"] is not None
    assert done[y]["result"]["model_version"] == done[z]["result"]["model_version"]
    assert done[v]["run_id"] is None and done[v]["result"]["model_version"] != done[y]["result"]["model_version"]
    jobs = client.get("/v1/unlearning-jobs", headers=auth(), params={"model_id": model["id"]}).json()["items"]
    assert sum(1 for j in jobs if j["request_id"] == "co-y") == 1


def test_a_member_cancelled_during_the_run_ends_cancelled_and_the_others_run_again_without_it(client, worker,
                                                                                              registered_model,
                                                                                              people):
    model = registered_model
    blocker = submit(client, model, people[3], "co-blocker-2", SLOW, coalesce=False)
    wait_for(client, blocker, states=("RUNNING",))
    p = submit(client, model, people[4], "co-p", SLOW)
    q = submit(client, model, people[5], "co-q", SLOW)
    client.post(f"/v1/unlearning-jobs/{blocker}:cancel", headers=auth())
    wait_for(client, p, states=("RUNNING",), condition=lambda j: j["run_id"] is not None)
    assert wait_for(client, q, states=("RUNNING",))["run_id"] == read(p).run_id
    client.post(f"/v1/unlearning-jobs/{q}:cancel", headers=auth())
    assert wait_for(client, q)["state"] == "CANCELLED"
    # p goes back to the queue and runs again, alone (its attempt not spent), and is never given q's version.
    again = wait_for(client, p, states=("QUEUED", "RUNNING"), condition=lambda j: j["run_id"] is None)
    assert again["result"] is None and again["attempt"] <= 1
    client.post(f"/v1/unlearning-jobs/{p}:cancel", headers=auth())
    assert wait_for(client, p)["state"] == "CANCELLED"


def submit(client, model, forget, request_id, params=None, key=None, **extra) -> str:
    headers = {**auth(), **({"Idempotency-Key": key} if key else {})}
    answer = client.post("/v1/unlearning-jobs", headers=headers, json={
        "model_id": model["id"], "request_id": request_id, "forget": forget, "params": params or FAST, **extra})
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]
