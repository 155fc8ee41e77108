"""connectivity results, job kind and MCU options

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 07:15:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('connectivity',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('model_id', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('version_a', sa.Integer(), nullable=False),
    sa.Column('version_b', sa.Integer(), nullable=False),
    sa.Column('curve', sa.String(length=16), nullable=False),
    sa.Column('mcu_holds', sa.Boolean(), nullable=True),
    sa.Column('barriers', sa.JSON(), nullable=False),
    sa.Column('points', sa.JSON(), nullable=False),
    sa.Column('suppress_first', sa.JSON(), nullable=True),
    sa.Column('ensemble', sa.JSON(), nullable=True),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('connectivity', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_connectivity_tenant'), ['tenant'], unique=False)
        batch_op.create_index(batch_op.f('ix_connectivity_model_id'), ['model_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_connectivity_job_id'), ['job_id'], unique=False)

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=16), server_default='unlearning', nullable=False))
        batch_op.add_column(sa.Column('mcu_options', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('mcu_options')
        batch_op.drop_column('kind')

    with op.batch_alter_table('connectivity', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_connectivity_job_id'))
        batch_op.drop_index(batch_op.f('ix_connectivity_model_id'))
        batch_op.drop_index(batch_op.f('ix_connectivity_tenant'))

    op.drop_table('connectivity')
