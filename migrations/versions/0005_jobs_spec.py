"""jobs.spec: the job's specification, checked once at submission and trusted by the worker (issue 13)

Frozen (issue 27): the revision adds the column and imports no live code. A job queued before it has no
specification; the worker derives one from what the job stored (lethe.service.domain.jobs.spec_from_request), by
the rules of the code that runs it. Ended jobs keep none (they never run again).

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


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('spec', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('spec')
