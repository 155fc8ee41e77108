"""Alembic: upgrade to head, downgrade to base and back, on SQLite and on PostgreSQL."""
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from service.models import Base
from tests.service.conftest import create_pg_database, drop_pg_database, migrate, pg_url

TABLES = {"api_keys", "models", "model_versions", "jobs", "idempotency_records", "audit_log", "retrain_references",
          "connectivity"}


def schema_drift(url: str) -> list:
    """What autogenerate would still add or drop: the migrations must build exactly the models' schema."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()


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
        assert {"lease_owner", "lease_expires_at", "forget_evidence", "attempt", "max_attempts", "kind",
                "mcu_options"} <= columns
        assert set(Base.metadata.tables) == TABLES and schema_drift(url) == []
        migrate(url, "base", down=True)
        assert tables(url) == set()
        migrate(url)
        assert tables(url) == TABLES
    finally:
        if name:
            drop_pg_database(name)
