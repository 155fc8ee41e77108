"""Webhook signatures, subscriptions and target checks (issue 14), without a service: our signer against the
Standard Webhooks reference verifier, rotation's two signatures, and the addresses a delivery may not reach."""
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from lethe.client.webhooks import Duplicate, Receiver, Rejected
from lethe.service.domain import webhooks
from lethe.service.infra.tables import utcnow


def delivery(secret, body=b'{"type":"job.succeeded"}', msg_id="msg_1", timestamp=None, previous=None):
    now = utcnow()
    endpoint = SimpleNamespace(secret=secret, previous_secret=previous,
                               previous_until=now + timedelta(hours=1) if previous else None)
    ts = int(time.time()) if timestamp is None else timestamp
    return body, {"webhook-id": msg_id, "webhook-timestamp": str(ts),
                  "webhook-signature": webhooks.signature_header(endpoint, msg_id, ts, body, now)}


def test_our_signature_is_what_the_reference_verifier_accepts():
    secret = webhooks.new_secret()
    assert secret.startswith("whsec_")
    body, headers = delivery(secret)
    assert Receiver([secret]).verify(body, headers) == {"type": "job.succeeded"}


def test_a_forged_tampered_stale_or_replayed_delivery_is_rejected():
    secret, other = webhooks.new_secret(), webhooks.new_secret()
    body, headers = delivery(secret)
    receiver = Receiver([secret])
    with pytest.raises(Rejected, match="signature"):
        receiver.verify(body + b" ", headers)  # the body changed on the way
    with pytest.raises(Rejected, match="signature"):
        Receiver([other]).verify(body, headers)  # signed with a secret that is not the endpoint's
    with pytest.raises(Rejected, match="too old"):
        receiver.verify(*delivery(secret, timestamp=int(time.time()) - 600))  # an old delivery, replayed later
    receiver.verify(body, headers)
    with pytest.raises(Duplicate, match="already processed"):
        receiver.verify(body, headers)  # the same delivery twice


def test_during_a_rotation_both_secrets_verify():
    old, new = webhooks.new_secret(), webhooks.new_secret()
    body, headers = delivery(new, previous=old)
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert Receiver([old]).verify(body, headers) and Receiver([new]).verify(body, headers)
    expired = SimpleNamespace(secret=new, previous_secret=old, previous_until=utcnow() - timedelta(seconds=1))
    assert len(webhooks.signature_header(expired, "m", 1, body, utcnow()).split(" ")) == 1


def test_subscriptions():
    assert webhooks.subscribed(["*"], "job.failed") and webhooks.subscribed(["job.*"], "job.queued")
    assert webhooks.subscribed(["report.created"], "report.created")
    assert not webhooks.subscribed(["job.*"], "version.created") and not webhooks.subscribed(["job.failed"], "job.f")
    assert webhooks.check_events(["job.*", "report.created", "job.*"]) == ["job.*", "report.created"]
    with pytest.raises(Exception, match="events"):
        webhooks.check_events(["job.exploded"])


@pytest.mark.parametrize("url,words", [
    ("http://127.0.0.1:8080/hook", "not a public address"), ("http://localhost/hook", "not a public address"),
    ("http://10.0.0.5/hook", "not a public address"), ("http://192.168.1.1/", "not a public address"),
    ("http://169.254.169.254/latest/meta-data", "not a public address"), ("http://[::1]/hook", "not a public"),
    ("http://[::ffff:127.0.0.1]/hook", "not a public"), ("http://100.64.0.1/", "not a public address"),
    ("http://0.0.0.0/", "not a public address"), ("ftp://example.com/", "http"), ("hook", "http"),
    ("https://user:pw@93.184.216.34/", "credentials"), ("http://[::1", "not a URL"),
    ("http://x:99999/", "not a URL"), ("http://" + "a" * 300 + ".com/", "does not resolve"),
])
def test_targets_a_tenant_may_not_reach(url, words):
    assert words in webhooks.target_problem(url, allow_private=False)


@pytest.mark.parametrize("address, public", [
    ("64:ff9b::a00:1", False), ("64:ff9b::7f00:1", False), ("64:ff9b::5db8:d822", True),  # NAT64: 10.0.0.1, 127.0.0.1
    ("64:ff9b:1::a00:1", False),  # NAT64's local-use prefix: the operator's own translator
    ("2002:a00:1::1", False), ("2002:a9fe:a9fe::1", False), ("2002:5db8:d822::1", True),  # 6to4: 10.0.0.1, 169.254..
    ("::10.0.0.1", False), ("::127.0.0.1", False), ("::", False), ("::93.184.216.34", True),  # IPv4-compatible
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False),  # Teredo, client 10.0.0.1
    ("::ffff:192.168.0.1", False), ("fc00::1", False), ("fe80::1", False), ("2001:db8::1", False),
    ("ff02::1", False), ("2606:4700:4700::1111", True),
])
def test_ipv6_reaching_a_private_ipv4_through_a_translation_is_refused(address, public):
    import ipaddress

    assert webhooks.public_address(ipaddress.ip_address(address)) is public
    problem = webhooks.target_problem(f"http://[{address}]/hook", allow_private=False)
    assert (problem is None) is public and (public or "not a public address" in problem)


def test_public_targets_pass_and_the_operator_may_allow_private_ones():
    assert webhooks.target_problem("https://93.184.216.34/hook", allow_private=False) is None
    assert webhooks.target_problem("http://127.0.0.1:9/hook", allow_private=True) is None
    assert "credentials" in webhooks.target_problem("http://u:p@127.0.0.1/", allow_private=True)
    assert "not a URL" in webhooks.target_problem("http://127.0.0.1:99999/", allow_private=True)


def test_a_post_goes_to_the_checked_address_and_a_dripping_receiver_is_cut_off():
    import socket
    import threading

    from lethe.worker.webhooks import post

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port, seen = server.getsockname()[1], {}

    def receive(drip: bool):
        connection, _ = server.accept()
        seen["request"] = connection.recv(65536)
        if drip:  # a status line, then a header every half second, never the end of the headers
            try:
                connection.sendall(b"HTTP/1.1 200 OK\r\n")
                for _ in range(20):
                    time.sleep(0.5)
                    connection.sendall(b"X-Slow: 1\r\n")
            except OSError:  # the client hung up at its deadline, as it should
                pass
        else:
            connection.sendall(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
        connection.close()

    threading.Thread(target=receive, args=(False,), daemon=True).start()
    # The name is not resolved again: the connection goes to the address the check approved, the Host stays.
    assert post(f"http://receiver.invalid:{port}/hook", "127.0.0.1", b"{}", {}, deadline=5) == 204
    assert f"host: receiver.invalid:{port}".encode() in seen["request"].lower()
    threading.Thread(target=receive, args=(True,), daemon=True).start()
    started = time.time()
    with pytest.raises(Exception):  # noqa: B017 (httpx's error for a closed connection varies by where it was)
        post(f"http://127.0.0.1:{port}/hook", "127.0.0.1", b"{}", {}, deadline=1.0)
    assert time.time() - started < 3
    server.close()
