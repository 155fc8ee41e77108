"""Keyed hashes of erased data (issue 26): what a job keeps of its forget records and their secrets, and what the
service keeps of the data subjects a request named, become HMAC-SHA256 under the evidence key (derived from the
audit key, which the database does not hold; lethe.service.domain.digests). Each keyed value is the HMAC of the plain
sha256 the row held, so no plaintext is needed. A forget set's manifest hash stays as it was: the reports and audit
entries that name it are hash-chained and signed, and it is a hash of the whole list, not of one guessable value.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 17:30:00
"""
import hashlib
import hmac

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def _key() -> bytes:
    """The evidence key as lethe.service.domain.digests derives it (frozen here: the label is part of this revision)."""
    from lethe.service.domain.audit_log import signing_key
    from lethe.service.settings import get_settings

    return hmac.new(signing_key(get_settings()), b"lethe-evidence-v1", hashlib.sha256).digest()


def _rekey(digest: str, key: bytes) -> str:
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def keyed_evidence(evidence: dict, key: bytes) -> dict:
    """A job's forget evidence with per-record and per-secret plain hashes replaced by keyed ones."""
    records = []
    for record in evidence.get("records", []):
        record = dict(record)
        if "sha256" in record:
            record["hmac"] = _rekey(record.pop("sha256"), key)
        if "secrets_sha256" in record:
            record["secrets_hmac"] = [_rekey(d, key) for d in record.pop("secrets_sha256")]
        records.append(record)
    return {**evidence, "records": records}


def upgrade() -> None:
    key = _key()
    connection = op.get_bind()
    jobs = sa.table('jobs', sa.column('id', sa.String), sa.column('forget_evidence', sa.JSON))
    for job_id, evidence in connection.execute(sa.select(jobs.c.id, jobs.c.forget_evidence)).all():
        if evidence:
            connection.execute(jobs.update().where(jobs.c.id == job_id)
                               .values(forget_evidence=keyed_evidence(evidence, key)))
    op.drop_index('ix_erasure_subjects_tenant_subject', table_name='erasure_subjects')
    with op.batch_alter_table('erasure_subjects') as batch:
        batch.alter_column('subject_sha256', new_column_name='subject_hmac', existing_type=sa.String(length=64),
                           existing_nullable=False)
    subjects = sa.table('erasure_subjects', sa.column('id', sa.Integer), sa.column('subject_hmac', sa.String))
    for row_id, digest in connection.execute(sa.select(subjects.c.id, subjects.c.subject_hmac)).all():
        connection.execute(subjects.update().where(subjects.c.id == row_id).values(subject_hmac=_rekey(digest, key)))
    op.create_index('ix_erasure_subjects_tenant_subject', 'erasure_subjects', ['tenant', 'subject_hmac'])


def downgrade() -> None:
    """The column takes its old name back; its values stay keyed (a keyed hash cannot be turned back into a plain
    one: that is its point), so an older service finds no subject recorded before the downgrade."""
    op.drop_index('ix_erasure_subjects_tenant_subject', table_name='erasure_subjects')
    with op.batch_alter_table('erasure_subjects') as batch:
        batch.alter_column('subject_hmac', new_column_name='subject_sha256', existing_type=sa.String(length=64),
                           existing_nullable=False)
    op.create_index('ix_erasure_subjects_tenant_subject', 'erasure_subjects', ['tenant', 'subject_sha256'])
