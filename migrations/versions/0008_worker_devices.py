"""worker_devices and jobs.queue: workers announce their device memory; jobs are routed by it (issue 15)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 13:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'worker_devices',
        sa.Column('id', sa.String(length=256), nullable=False),
        sa.Column('queue', sa.String(length=128), nullable=False),
        sa.Column('device', sa.String(length=64), nullable=False),
        sa.Column('capacity_bytes', sa.BigInteger(), nullable=False),
        sa.Column('auto_dtype', sa.String(length=16), nullable=False),
        sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_worker_devices_queue', 'worker_devices', ['queue'])
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('queue', sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('queue')
    op.drop_index('ix_worker_devices_queue', table_name='worker_devices')
    op.drop_table('worker_devices')
