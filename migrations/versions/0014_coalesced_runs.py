"""Coalesced runs and a fixed anchor (issue 28): the run a job was part of, whether a request may join one, and the
version a model's retain term anchors to.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 03:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('run_id', sa.String(length=40), nullable=True))
        # A string default, which SQLite adds in place ("1" is true on PostgreSQL too; see 0010).
        batch.add_column(sa.Column('coalesce', sa.Boolean(), nullable=False, server_default="1"))
        batch.create_index('ix_jobs_run_id', ['run_id'])
    with op.batch_alter_table('models') as batch:
        batch.add_column(sa.Column('anchor_version', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('models') as batch:
        batch.drop_column('anchor_version')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_index('ix_jobs_run_id')
        batch.drop_column('coalesce')
        batch.drop_column('run_id')
