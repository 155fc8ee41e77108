"""A model's utility set (issue 28): records no run trains on, measured before and after every erasure.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 07:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('models') as batch:
        batch.add_column(sa.Column('utility_records', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('models') as batch:
        batch.drop_column('utility_records')
