"""Retire and purge (issue 26): when a version stopped being served and when its files were deleted; a model's
setting to retire the versions an erasure supersedes; when a report's quoted examples are scrubbed.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 17:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('model_versions') as batch:
        batch.add_column(sa.Column('retired_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('purged_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('examples_until', sa.DateTime(timezone=True), nullable=True))
        batch.create_index('ix_jobs_examples_until', ['examples_until'])
    with op.batch_alter_table('models') as batch:
        # A string default, which SQLite adds in place ("0" is false on PostgreSQL too): an expression would make
        # batch mode rebuild the table, which the jobs' foreign keys to it forbid.
        batch.add_column(sa.Column('retire_predecessors', sa.Boolean(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_index('ix_jobs_examples_until')
        batch.drop_column('examples_until')
    with op.batch_alter_table('models') as batch:
        batch.drop_column('retire_predecessors')
    with op.batch_alter_table('model_versions') as batch:
        batch.drop_column('purged_at')
        batch.drop_column('retired_at')
