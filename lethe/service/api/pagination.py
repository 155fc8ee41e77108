"""Opaque page tokens: (created_at, id) of the last item, base64-encoded, for stable keyset paging."""
from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone

from sqlalchemy import and_, or_

from lethe.service.domain.errors import invalid


def encode_token(created_at: datetime, item_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at.isoformat(), item_id]).encode()).decode()


ITEM_ID = re.compile(r"[a-z]{2,16}_[0-9a-f]{32}")  # lethe.service.infra.tables.new_id


def decode_token(token: str) -> tuple[datetime, str]:
    """The token's (created_at, id), checked to be what encode_token writes: a forged one (a naive time, a
    number, an id no item has) is refused with 422, never handed to the database."""
    try:
        if len(token) > 512:
            raise ValueError
        stamp, item_id = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        created_at = datetime.fromisoformat(stamp)
        if created_at.tzinfo is None or not isinstance(item_id, str) or not ITEM_ID.fullmatch(item_id):
            raise ValueError
        return created_at.astimezone(timezone.utc), item_id
    except Exception:
        raise invalid("page_token is not a token this service issued", "page_token") from None


def paginate(session, query, table, page_size: int, page_token: str | None):
    """Newest first. Returns (items, next_page_token)."""
    if page_token:
        created_at, item_id = decode_token(page_token)
        query = query.where(or_(table.created_at < created_at,
                                and_(table.created_at == created_at, table.id < item_id)))
    rows = session.scalars(query.order_by(table.created_at.desc(), table.id.desc()).limit(page_size + 1)).all()
    more = len(rows) > page_size
    rows = rows[:page_size]
    return rows, encode_token(rows[-1].created_at, rows[-1].id) if more and rows else None
