"""MASC's content suppression (issue 24): the stored specifications of jobs not yet ended take the new parameter
names. secret_focus becomes suppress ("whole" where it was false, else "content"), rho_secret rho_content,
secret_max_probability content_max_probability; lambda_fluency and lambda_redistribute (secret focus's two KL terms,
replaced by the targets' one) are dropped. Ended jobs keep their specification as it ran.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 18:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

RENAMED = {"rho_secret": "rho_content", "secret_max_probability": "content_max_probability"}
DROPPED = ("lambda_fluency", "lambda_redistribute")


def upgraded(spec: dict | None) -> dict | None:
    """A stored specification with MASC's parameters under their new names (others unchanged)."""
    if not spec or spec.get("method") != "masc" or not isinstance(spec.get("params"), dict):
        return spec
    params = dict(spec["params"])
    if "secret_focus" in params:
        params["suppress"] = "whole" if params.pop("secret_focus") is False else "content"
    for old, new in RENAMED.items():
        if old in params:
            params[new] = params.pop(old)
    for name in DROPPED:
        params.pop(name, None)
    return {**spec, "params": params}


def upgrade() -> None:
    jobs = sa.table('jobs', sa.column('id', sa.String), sa.column('state', sa.String), sa.column('spec', sa.JSON))
    connection = op.get_bind()
    for row in connection.execute(sa.select(jobs).where(jobs.c.state.in_(("QUEUED", "RUNNING", "CANCELLING")))):
        new = upgraded(row.spec)
        if new != row.spec:
            connection.execute(jobs.update().where(jobs.c.id == row.id).values(spec=new))


def downgrade() -> None:
    pass  # the old names are not restored: a job queued under 0009 runs with the new engine
