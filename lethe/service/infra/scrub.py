"""Erased text must not survive on disk in the database's leftovers (issue 12). A job's forget records are
set to NULL when it ends (lethe.service.domain.jobs.end_job); the old row versions stay: in SQLite's free pages and its
write-ahead log, in PostgreSQL's dead tuples until vacuum. SQLite runs with secure_delete (freed content
is zeroed; lethe.service.infra.db) and its log is checkpointed and truncated here; PostgreSQL's jobs table is
vacuumed here, which frees the dead tuples for reuse (a VACUUM FULL, a maintenance step with an exclusive
lock, also rewrites the file). The sweeper calls this after jobs end."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine


def scrub(engine: Engine) -> tuple[bool, str]:
    """Drop what the database still holds of ended jobs' records: (done, what was done). Not done: a
    reader kept SQLite's log busy; try again."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            busy, _, _ = connection.execute(text("PRAGMA wal_checkpoint(TRUNCATE)")).one()
        if busy:
            return False, "sqlite: write-ahead log busy, not truncated"
        return True, "sqlite: write-ahead log checkpointed and truncated"
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM jobs"))
        return True, "postgresql: jobs vacuumed"
    return True, f"{engine.dialect.name}: nothing to do"
