"""Signed webhooks through the real service (issue 14): a receiving HTTP server on 127.0.0.1 gets every event of a
job as signed, also after it was down for a while; a delivery that keeps failing is dead-lettered and can be
redelivered with its webhook-id; a rotated secret signs beside the old one; the log says what happened."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lethe.client.webhooks import Receiver, Rejected
from tests.live_service import auth, wait_for

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

FAST = {"lr": 1e-3, "max_steps": 1000}
QUICK_AUDIT = {"quantization": False, "relearn": False}
JOB_EVENTS = ["job.queued", "job.running", "version.created", "report.created", "job.succeeded"]


class Hook:
    """A receiving server: records each POST (path, headers, body); answers 503 while `down`, 500 on paths in
    `failing`, else 204."""

    def __init__(self):
        hook = self
        self.received, self.down, self.failing = [], False, set()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = 503 if hook.down else 500 if self.path in hook.failing else 204
                hook.received.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                      "status": status})
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accepted(self, path):
        return [r for r in self.received if r["path"] == path and r["status"] == 204]


@pytest.fixture(scope="module")
def hook():
    server = Hook()
    yield server
    server.server.shutdown()


def register(client, url, **extra):
    answer = client.post("/v1/webhooks", headers=auth(), json={"url": url, **extra})
    assert answer.status_code == 201, answer.text
    return answer.json()


def run_job(client, model, forget, request_id):
    job = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": model["id"], "request_id": request_id, "forget": forget, "params": FAST,
        "audit": QUICK_AUDIT}).json()
    done = wait_for(client, job["id"], timeout=400)
    assert done["state"] == "SUCCEEDED", done
    return done


def deliveries(client, endpoint_id, **params):
    return client.get(f"/v1/webhooks/{endpoint_id}/deliveries", headers=auth(), params=params).json()["items"]


def settle(client, endpoint_id, count, timeout=180):
    """Wait until `count` deliveries of the endpoint are no longer PENDING."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        items = deliveries(client, endpoint_id)
        if len(items) >= count and all(d["state"] != "PENDING" for d in items):
            return items
        time.sleep(0.3)
    raise AssertionError(deliveries(client, endpoint_id))


def events_of(received, receiver, job_id):
    events = [receiver.verify(r["body"], r["headers"]) for r in received]
    return [e for e in events if e["data"]["id"] == job_id or e["data"].get("job_id") == job_id]


def test_every_event_of_a_job_arrives_signed_even_after_the_receiver_was_down(client, worker, registered_model,
                                                                               forget_records, hook):
    endpoint = register(client, hook.url + "/all", description="governance system")
    assert endpoint["secret"].startswith("whsec_") and endpoint["events"] == ["*"]
    assert client.get(f"/v1/webhooks/{endpoint['id']}", headers=auth()).json()["secret"] is None  # shown once
    done = run_job(client, registered_model, forget_records[:5], "dsar-hook-1")
    settle(client, endpoint["id"], len(JOB_EVENTS))
    receiver = Receiver([endpoint["secret"]])
    # A few deliveries are in flight at once, so arrival order may vary: audit_seq gives the order of the changes.
    events = sorted(events_of(hook.accepted("/all"), receiver, done["id"]), key=lambda e: e["data"]["audit_seq"])
    assert [e["type"] for e in events] == JOB_EVENTS
    assert "worker" not in events[1]["data"]  # the audit log's worker host stays out of a tenant's payloads
    assert events[-1]["data"]["result"]["model_version"] == done["result"]["model_version"]

    # Down for a while: the worker retries with backoff, and once the receiver is back every event arrives, each
    # under the webhook-id of its first attempt.
    hook.down = True
    before = len(hook.received)
    job = client.post("/v1/unlearning-jobs", headers=auth(), json={
        "model_id": registered_model["id"], "request_id": "dsar-hook-2", "forget": forget_records[5:8],
        "params": FAST, "audit": QUICK_AUDIT}).json()
    deadline = time.time() + 120
    while len([r for r in hook.received[before:] if r["status"] == 503]) < 3:
        assert time.time() < deadline, deliveries(client, endpoint["id"])
        time.sleep(0.05)
    hook.down = False
    down = wait_for(client, job["id"], timeout=400)
    assert down["state"] == "SUCCEEDED", down
    items = settle(client, endpoint["id"], 2 * len(JOB_EVENTS))
    assert all(d["state"] == "DELIVERED" for d in items), items
    late = events_of(hook.accepted("/all")[len(events):], Receiver([endpoint["secret"]]), down["id"])
    # Each event once, in the order of audit_seq.
    assert [e["type"] for e in sorted(late, key=lambda e: e["data"]["audit_seq"])] == JOB_EVENTS
    mine = [d for d in items if d["payload"]["data"]["id"] == down["id"] or
            d["payload"]["data"].get("job_id") == down["id"]]
    retried = [d for d in mine if d["log"][0]["status"] == 503]
    assert retried and all(len(d["log"]) >= 2 and d["log"][-1]["status"] == 204 for d in retried)
    ids = [r["headers"]["webhook-id"] for r in hook.received[before:]]
    assert set(ids) == {d["id"] for d in mine}  # every attempt of a delivery carries its one id


def test_a_failing_delivery_is_dead_lettered_then_redelivered_and_secrets_rotate(client, worker, registered_model,
                                                                                 forget_records, hook):
    endpoint = register(client, hook.url + "/reports", events=["report.created"])
    hook.failing.add("/reports")
    done = run_job(client, registered_model, forget_records[:3], "dsar-hook-3")
    [dead] = settle(client, endpoint["id"], 1)
    assert dead["state"] == "DEAD" and dead["attempts"] == 6 and [a["status"] for a in dead["log"]] == [500] * 6
    assert dead["payload"]["data"]["id"] == done["id"]
    assert deliveries(client, endpoint["id"], state="DEAD")[0]["id"] == dead["id"]

    hook.failing.discard("/reports")
    again = client.post(f"/v1/webhooks/{endpoint['id']}/deliveries/{dead['id']}:redeliver", headers=auth())
    assert again.status_code == 200 and again.json()["state"] == "PENDING"
    [delivered] = settle(client, endpoint["id"], 1)
    assert delivered["state"] == "DELIVERED" and delivered["attempts"] == 1 and len(delivered["log"]) == 7
    [received] = hook.accepted("/reports")
    assert received["headers"]["webhook-id"] == dead["id"]  # the same id: a receiver that saw it can drop it
    assert Receiver([endpoint["secret"]]).verify(received["body"], received["headers"])["type"] == "report.created"

    rotated = client.post(f"/v1/webhooks/{endpoint['id']}:rotate-secret", headers=auth()).json()
    assert rotated["secret"] != endpoint["secret"] and rotated["previous_secret_valid_until"] is not None
    run_job(client, registered_model, forget_records[3:6], "dsar-hook-4")
    settle(client, endpoint["id"], 2)
    newest = hook.accepted("/reports")[-1]
    assert len(newest["headers"]["webhook-signature"].split(" ")) == 2
    Receiver([endpoint["secret"]]).verify(newest["body"], newest["headers"])  # receivers not yet switched
    Receiver([rotated["secret"]]).verify(newest["body"], newest["headers"])
    with pytest.raises(Rejected):
        Receiver([rotated["secret"]]).verify(received["body"], received["headers"])  # old deliveries: old secret


def test_bad_endpoints_and_other_tenants(client, hook):
    for body, field in (({"url": "ftp://x"}, "url"), ({"url": hook.url, "events": ["job.exploded"]}, "events"),
                        ({"url": "http://u:p@127.0.0.1/"}, "url")):
        answer = client.post("/v1/webhooks", headers=auth(), json=body)
        assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == field, answer.text
    mine = register(client, hook.url + "/mine")
    reader = client.post("/v1/api-keys", headers=auth(), json={"tenant": "elsewhere", "scopes": ["jobs:read"]})
    assert client.get(f"/v1/webhooks/{mine['id']}", headers=auth(reader.json()["key"])).status_code == 404
    assert client.post("/v1/webhooks", headers=auth(reader.json()["key"]), json={"url": hook.url}).status_code == 403
    gone = client.delete(f"/v1/webhooks/{mine['id']}", headers=auth()).json()
    assert gone["disabled_at"] is not None


def tenant_admin(client, tenant):
    answer = client.post("/v1/api-keys", headers=auth(), json={"tenant": tenant, "scopes": ["admin", "jobs:read"]})
    assert answer.status_code == 201, answer.text
    return answer.json()["key"]


def test_a_tenants_slow_endpoints_do_not_hold_up_another_tenants_deliveries(client, worker, hook):
    """Issue 26: four slow endpoints of one tenant took every slot of the dispatcher (and it waited for a whole
    round); now each endpoint has one POST in flight and a tenant at most two, so another tenant's event goes out
    at once."""
    from lethe.service.domain import audit_log
    from lethe.service.infra.db import session_scope

    slow_seen = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", 0)))
            slow_seen.append(time.time())
            time.sleep(2.5)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    slow = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    slow_key, fast_key = tenant_admin(client, "slowco"), tenant_admin(client, "fastco")
    endpoints = [client.post("/v1/webhooks", headers=auth(slow_key), json={
        "url": f"http://127.0.0.1:{slow.server_address[1]}/s{i}", "events": ["job.*"]}).json() for i in range(4)]
    fast = client.post("/v1/webhooks", headers=auth(fast_key), json={"url": hook.url + "/fastco",
                                                                     "events": ["job.*"]}).json()
    try:
        with session_scope() as session:
            for i in range(3):  # twelve slow deliveries, queued first
                audit_log.append(session, "slowco", "job.queued", f"job_slow{i}", {"request_id": f"s{i}"})
        time.sleep(0.5)  # the dispatcher has started on them
        with session_scope() as session:
            audit_log.append(session, "fastco", "job.queued", "job_fast", {"request_id": "f"})
        sent = time.time()
        deadline = sent + 20
        while not hook.accepted("/fastco") and time.time() < deadline:
            time.sleep(0.05)
        assert hook.accepted("/fastco"), "the other tenant's delivery never arrived"
        waited = time.time() - sent
        assert waited < 2.0, f"fastco waited {waited:.1f} s behind slowco's endpoints"
        assert slow_seen, "the slow deliveries were not being sent"
    finally:
        for endpoint in endpoints:
            client.delete(f"/v1/webhooks/{endpoint['id']}", headers=auth(slow_key))
        client.delete(f"/v1/webhooks/{fast['id']}", headers=auth(fast_key))
        slow.shutdown()


def test_a_tenant_has_at_most_max_webhook_endpoints(client, hook):
    key = tenant_admin(client, "manyhooks")
    made = [client.post("/v1/webhooks", headers=auth(key), json={"url": hook.url + f"/m{i}"}) for i in range(10)]
    assert all(m.status_code == 201 for m in made)
    refused = client.post("/v1/webhooks", headers=auth(key), json={"url": hook.url + "/m10"})
    assert refused.status_code == 409 and "LETHE_MAX_WEBHOOK_ENDPOINTS" in refused.json()["detail"]
    client.delete(f"/v1/webhooks/{made[0].json()['id']}", headers=auth(key))
    assert client.post("/v1/webhooks", headers=auth(key), json={"url": hook.url + "/m10"}).status_code == 201
