"""The audit log's hash chain, on a PostgreSQL database of its own: an edited, deleted or inserted
row is named by verification."""
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from service import audit_log
from service.db import make_engine
from tests.service.conftest import create_pg_database, drop_pg_database, migrate, pg_url


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
