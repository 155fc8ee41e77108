"""erasure_subjects: the data subjects a deletion request names, as hashes; models.format: how a model's jobs
show records to it, plain or in its chat template (issue 14)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'erasure_subjects',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('tenant', sa.String(length=128), nullable=False),
        sa.Column('subject_sha256', sa.String(length=64), nullable=False),
        sa.Column('job_id', sa.String(length=40), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_erasure_subjects_job_id', 'erasure_subjects', ['job_id'])
    op.create_index('ix_erasure_subjects_tenant_subject', 'erasure_subjects', ['tenant', 'subject_sha256'])
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.add_column(sa.Column('format', sa.String(length=16), nullable=False, server_default='plain'))


def downgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_column('format')
    op.drop_index('ix_erasure_subjects_tenant_subject', table_name='erasure_subjects')
    op.drop_index('ix_erasure_subjects_job_id', table_name='erasure_subjects')
    op.drop_table('erasure_subjects')
