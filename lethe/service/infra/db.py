"""The database engine and sessions."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import cast

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from lethe.service.settings import get_settings


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(connection, _):  # WAL: readers do not block the worker's writes
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            # Deleted and overwritten content is zeroed on disk: erased records do not survive in free pages.
            cursor.execute("PRAGMA secure_delete=ON")
            cursor.close()

        return engine
    # Above the API's 40 worker threads: a request holds a connection only inside its own thread.
    return create_engine(url, pool_pre_ping=True, pool_size=20, max_overflow=30, pool_timeout=10)


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().database_url)


@lru_cache
def _sessions() -> sessionmaker:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = _sessions()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# The default of an endpoint's `session` parameter: @transactional passes the real one, and FastAPI never
# sees the parameter. Typed as a Session so that the endpoint's body type-checks.
INJECTED: Session = cast(Session, None)


def transactional(endpoint):
    """Give a sync endpoint its `session` for the length of the call, opened and closed in the same
    worker thread. (A yield dependency would hold the connection across awaits, and under load the
    threads waiting for a connection starve the ones that would give theirs back.)"""
    signature = inspect.signature(endpoint)

    @functools.wraps(endpoint)
    def wrapper(*args, **kwargs):
        with session_scope() as session:
            return endpoint(*args, session=session, **kwargs)

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for p in signature.parameters.values() if p.name != "session"])
    return wrapper
