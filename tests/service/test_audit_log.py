"""The audit log's hash chain, on a PostgreSQL database of its own: an edited, deleted or inserted
row is named by verification."""
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from lethe.service.domain import audit_log
from lethe.service.infra.db import make_engine
from tests.live_service import create_pg_database, drop_pg_database, migrate, pg_url

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out


@pytest.fixture
def session():
    name = create_pg_database()
    url = pg_url(name)
    migrate(url)
    engine = make_engine(url)
    with Session(engine) as s:
        for i in range(5):
            audit_log.append(s, "t1", "job.queued", f"job_{i}", {"i": i, "nested": {"x": [1, 2.5, "y"]}})
        s.commit()
        yield s
    engine.dispose()
    drop_pg_database(name)


def test_an_intact_chain_verifies(session):
    result = audit_log.verify(session)
    assert result["ok"] is True and result["entries"] == 5 and result["broken_at"] is None


def test_an_edited_row_is_named(session):
    session.execute(text("""UPDATE audit_log SET data = '{"i": 99, "nested": {"x": [1, 2.5, "y"]}}' WHERE seq = 3"""))
    session.commit()
    result = audit_log.verify(session)
    assert result["ok"] is False and result["broken_at"] == 3 and "edited" in result["reason"]


def test_a_deleted_row_breaks_the_next_link(session):
    session.execute(text("DELETE FROM audit_log WHERE seq = 2"))
    session.commit()
    result = audit_log.verify(session)
    assert result["ok"] is False and result["broken_at"] == 3 and "removed or inserted" in result["reason"]


def test_a_row_with_a_forged_hash_is_named(session):
    # Editing a row and writing any hash of its own: its content no longer matches the chain.
    session.execute(text("UPDATE audit_log SET subject = 'forged', hash = repeat('a', 64) WHERE seq = 4"))
    session.commit()
    assert audit_log.verify(session)["broken_at"] == 4


KEY = b"a key the database does not hold"


def rewrite_from(session, seq: int) -> None:
    """What someone with the database can do: change an entry and recompute every hash after it."""
    from lethe.service.infra.tables import AuditEntry

    session.execute(text(f"UPDATE audit_log SET subject = 'rewritten' WHERE seq = {seq}"))
    prev = audit_log.GENESIS
    for entry in session.query(AuditEntry).order_by(AuditEntry.seq):
        entry.prev_hash = prev
        entry.hash = audit_log.entry_hash(prev, audit_log._stamp(entry), entry.tenant, entry.kind, entry.subject,
                                          entry.data)
        prev = entry.hash
    session.commit()


def test_a_chain_rewritten_whole_passes_alone_and_fails_against_a_kept_checkpoint(session):
    kept = audit_log.checkpoint(session, KEY)
    assert kept["seq"] == 5 and audit_log.verify(session, KEY, [kept])["ok"] is True
    rewrite_from(session, 2)
    assert audit_log.verify(session)["ok"] is True  # the chain alone cannot tell
    result = audit_log.verify(session, KEY, [kept])
    assert result["ok"] is False and result["broken_at"] == 5 and "rewritten" in result["reason"]


def test_a_chain_cut_back_fails_against_a_kept_checkpoint(session):
    kept = audit_log.checkpoint(session, KEY)
    session.execute(text("DELETE FROM audit_log WHERE seq >= 4"))
    session.commit()
    assert audit_log.verify(session)["ok"] is True
    result = audit_log.verify(session, KEY, [kept])
    assert result["ok"] is False and "cut back" in result["reason"]


def test_a_forged_checkpoint_is_refused_and_tenants_count_their_own(session):
    forged = {"seq": 5, "hash": audit_log.checkpoint(session, KEY)["hash"], "signature": "0" * 64}
    assert "signature" in audit_log.verify(session, KEY, [forged])["reason"]
    assert audit_log.verify(session, b"another key", [audit_log.checkpoint(session, KEY)])["ok"] is False
    audit_log.append(session, "t2", "job.queued", "job_x", {})
    session.commit()
    assert (audit_log.verify(session, tenant="t2")["entries"] == 1
            and audit_log.verify(session, tenant="t1")["entries"] == 5)


def test_verification_walks_on_from_the_last_verified_point(session):
    """Issue 26: a verification with the key records how far the chain was whole (signed); the next walks only
    what was appended since. A change before that point is found by a full walk; one at the point itself (the
    chain cut back or rewritten there) by any walk; a verification record not signed by us is ignored."""
    from lethe.service.infra.tables import AuditVerification

    first = audit_log.verify(session, KEY)
    assert first["ok"] and first["from_seq"] == 0 and first["walked"] == 5
    session.commit()
    for i in range(3):
        audit_log.append(session, "t1", "job.running", f"job_{i}", {})
    session.commit()
    again = audit_log.verify(session, KEY)
    assert again["ok"] and again["from_seq"] == 5 and again["walked"] == 3 and again["entries"] == 8
    session.commit()
    assert audit_log.verify(session, KEY)["walked"] == 0

    # An edit before the verified point: an incremental walk does not read it, a full walk names it.
    session.execute(text("""UPDATE audit_log SET data = '{"i": 42}' WHERE seq = 2"""))
    session.commit()
    assert audit_log.verify(session, KEY)["ok"] is True
    full = audit_log.verify(session, KEY, full=True)
    assert full["ok"] is False and full["broken_at"] == 2

    # A verification record someone with the database wrote: not ours, not trusted.
    session.execute(text("DELETE FROM audit_verifications"))
    session.add(AuditVerification(seq=8, hash=session.execute(text("SELECT hash FROM audit_log WHERE seq = 8"))
                                  .scalar_one(), signature="0" * 64))
    session.commit()
    result = audit_log.verify(session, KEY)
    assert result["from_seq"] == 0 and result["broken_at"] == 2

    # The entry a verification ended at, rewritten: every walk says so.
    session.execute(text("DELETE FROM audit_verifications"))
    session.execute(text("""UPDATE audit_log SET data = '{"i": 1, "nested": {"x": [1, 2.5, "y"]}}' WHERE seq = 2"""))
    session.commit()
    assert audit_log.verify(session, KEY)["ok"] is True
    session.commit()
    rewrite_from(session, 7)
    cut = audit_log.verify(session, KEY)
    assert cut["ok"] is False and cut["broken_at"] == 8 and "rewritten" in cut["reason"]


def test_a_full_walk_through_the_api_is_an_admins_call(client):
    from tests.live_service import auth

    reader = client.post("/v1/api-keys", headers=auth(), json={"tenant": "default", "scopes": ["jobs:read"]}).json()
    assert client.get("/v1/audit-log/verify?full=true", headers=auth(reader["key"])).status_code == 403
    assert client.get("/v1/audit-log/verify", headers=auth(reader["key"])).json()["ok"] is True
    whole = client.get("/v1/audit-log/verify?full=true", headers=auth()).json()
    assert whole["ok"] is True and whole["from_seq"] == 0
    # On from there: the next walk reads what was appended since (this test's own calls; and any entry a job of an
    # earlier test, still finishing on the shared worker, wrote meanwhile), not the chain again.
    after = client.get("/v1/audit-log/verify", headers=auth()).json()
    assert after["ok"] is True and after["from_seq"] > 0
    assert after["walked"] <= after["entries"] - whole["entries"] + 2
