"""jobs.spec: the job's specification, checked once at submission and trusted by the worker (issue 13)

Jobs not yet ended are given theirs from what they stored (params as requested, preset, MCU options), parsed by
the engine's rules as this revision runs; ended jobs keep none (they never run again).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def _spec(row) -> dict | None:
    """None where the stored request no longer passes (the worker then fails the job, saying so)."""
    from worker.engine.connectivity.params import MARGIN_FIELDS
    from worker.engine.errors import EngineInputError
    from worker.engine.jobspec import JobSpec

    options = dict(row.mcu_options or {})
    flat = {**(options.get("params") or {}),
            **{k: options[k] for k in ("curve", "points", "ensemble", "tolerance") if k in options}}
    try:
        if row.kind == "connectivity":
            return JobSpec.curve(flat).stored()
        # An unlearning job's curves now take the job's own margin.
        flat = {k: v for k, v in flat.items() if k not in MARGIN_FIELDS}
        return JobSpec.unlearning(row.method, row.params, row.preset, flat if row.mcu_options else None).stored()
    except EngineInputError:
        return None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('spec', sa.JSON(), nullable=True))
    jobs = sa.table('jobs', sa.column('id', sa.String), sa.column('kind', sa.String), sa.column('state', sa.String),
                    sa.column('method', sa.String), sa.column('preset', sa.String), sa.column('params', sa.JSON),
                    sa.column('mcu_options', sa.JSON), sa.column('spec', sa.JSON))
    connection = op.get_bind()
    for row in connection.execute(sa.select(jobs).where(jobs.c.state.in_(("QUEUED", "RUNNING", "CANCELLING")))):
        connection.execute(jobs.update().where(jobs.c.id == row.id).values(spec=_spec(row)))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('spec')
