"""How far the audit chain was last verified, signed (issue 26): verification walks on from there.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 18:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'audit_verifications',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False),
        sa.Column('signature', sa.String(length=64), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_audit_verifications_seq', 'audit_verifications', ['seq'])


def downgrade() -> None:
    op.drop_index('ix_audit_verifications_seq', table_name='audit_verifications')
    op.drop_table('audit_verifications')
