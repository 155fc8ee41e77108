"""A version's parameter count, read from its safetensors headers once and kept (issue 26): a submission no longer
reads the headers of every shard. Existing versions are read at their next job.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 17:45:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('model_versions') as batch:
        batch.add_column(sa.Column('parameters', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('model_versions') as batch:
        batch.drop_column('parameters')
