"""Small helpers the service tests share: row counts and model registration through the API."""
import uuid

from sqlalchemy import func, select

from lethe.service.infra.db import session_scope
from tests.live_service import auth


def count(table) -> int:
    with session_scope() as session:
        return session.scalar(select(func.count()).select_from(table))


def register(client, source, name=None):
    """POST /v1/models with the admin key; the answer as it came."""
    return client.post("/v1/models", headers=auth(), json={"name": name or "m-" + uuid.uuid4().hex[:6],
                                                           "source": source})
