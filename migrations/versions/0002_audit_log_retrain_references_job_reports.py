"""audit log, retrain references, job reports

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 04:46:52.532072
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('subject', sa.String(length=128), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('seq'),
    sa.UniqueConstraint('hash')
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_log_tenant'), ['tenant'], unique=False)

    op.create_table('retrain_references',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('model_id', sa.String(length=40), nullable=False),
    sa.Column('version_number', sa.Integer(), nullable=False),
    sa.Column('forget_manifest_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('model_id', 'forget_manifest_sha256')
    )
    with op.batch_alter_table('retrain_references', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_retrain_references_model_id'), ['model_id'], unique=False)

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('audit_options', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('report', sa.JSON(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('report')
        batch_op.drop_column('audit_options')

    with op.batch_alter_table('retrain_references', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_retrain_references_model_id'))

    op.drop_table('retrain_references')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_log_tenant'))

    op.drop_table('audit_log')
