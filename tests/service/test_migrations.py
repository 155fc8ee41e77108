"""Alembic: upgrade to head, downgrade to base and back, on SQLite and on PostgreSQL."""
import pytest
from sqlalchemy import create_engine, inspect

from tests.service.conftest import create_pg_database, drop_pg_database, migrate, pg_url

TABLES = {"api_keys", "models", "model_versions", "jobs", "idempotency_records", "audit_log", "retrain_references"}


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_upgrade_downgrade_upgrade(database, tmp_path):
    if database == "sqlite":
        url, name = f"sqlite:///{tmp_path / 'm.db'}", None
    else:
        name = create_pg_database()
        url = pg_url(name)
    try:
        migrate(url)
        assert tables(url) == TABLES
        columns = {c["name"] for c in inspect(create_engine(url)).get_columns("jobs")}
        assert {"lease_owner", "lease_expires_at", "forget_evidence", "attempt", "max_attempts"} <= columns
        migrate(url, "base", down=True)
        assert tables(url) == set()
        migrate(url)
        assert tables(url) == TABLES
    finally:
        if name:
            drop_pg_database(name)
