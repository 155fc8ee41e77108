"""Alembic: upgrade to head, downgrade to base and back, on SQLite and on PostgreSQL."""
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from lethe.service.infra.tables import Base
from tests.live_service import create_pg_database, drop_pg_database, migrate, pg_url

pytestmark = pytest.mark.slow  # trains a model or runs the service: `make test-fast` leaves it out

TABLES = {"api_keys", "models", "model_versions", "jobs", "idempotency_records", "audit_log", "retrain_references",
          "connectivity", "erasure_subjects", "webhook_endpoints", "webhook_deliveries", "worker_devices",
          "audit_verifications"}


def schema_drift(url: str) -> list:
    """What autogenerate would still add or drop: the migrations must build exactly the models' schema."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_upgrade_downgrade_upgrade(database, tmp_path):
    if database == "sqlite":
        url, name = f"sqlite:///{tmp_path / 'm.db'}", None
    else:
        name = create_pg_database()
        url = pg_url(name)
    try:
        migrate(url)
        assert tables(url) == TABLES
        columns = {c["name"] for c in inspect(create_engine(url)).get_columns("jobs")}
        assert {"lease_owner", "lease_expires_at", "forget_evidence", "attempt", "max_attempts", "kind",
                "mcu_options", "queue"} <= columns
        assert set(Base.metadata.tables) == TABLES and schema_drift(url) == []
        migrate(url, "base", down=True)
        assert tables(url) == set()
        migrate(url)
        assert tables(url) == TABLES
    finally:
        if name:
            drop_pg_database(name)


def test_jobs_queued_before_0005_get_their_specification_from_what_they_stored(tmp_path):
    """0005 is frozen (no live code): a job queued before it keeps a NULL specification, and the worker derives
    one from what the job stored by today's rules (spec_from_request); ended jobs keep none."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from lethe.service.domain.jobs import spec_from_request
    from lethe.service.infra.tables import Job

    url = f"sqlite:///{tmp_path / 'spec.db'}"
    migrate(url, "0004")
    engine = create_engine(url)
    columns = ("id, tenant, kind, model_id, base_version, follows_head, request_id, method, preset, params, "
               "state, forget_evidence, progress, attempt, max_attempts, cancel_requested, created_at, updated_at, "
               "mcu_options")
    mcu = '{"against": [1], "points": 3, "params": {"k": 4}}'
    rows = [("job_q", "masc", "tofu-llama2", '{"k": 3}', "QUEUED", mcu),
            ("job_b", "npo", None, '{"lora": false}', "RUNNING", None),
            ("job_x", "masc", None, '{"alpha": 7}', "QUEUED", None),
            ("job_d", "masc", None, '{}', "SUCCEEDED", None)]
    with engine.begin() as connection:
        insert_model(connection)
        for job_id, method, preset, params, state, mcu in rows:
            connection.execute(text(f"INSERT INTO jobs ({columns}) VALUES (:id, 't', 'unlearning', 'mdl_1', 1, 0, "
                                    ":id, :method, :preset, :params, :state, '{}', '{}', 0, 3, 0, "
                                    "'2026-12-01 00:00:00', '2026-12-01 00:00:00', :mcu)"),
                               dict(id=job_id, method=method, preset=preset, params=params, state=state, mcu=mcu))
    migrate(url)
    with Session(engine) as session:
        jobs = {job.id: job for job in session.query(Job)}
        assert all(job.spec is None for job in jobs.values())
        queued, running = spec_from_request(jobs["job_q"]), spec_from_request(jobs["job_b"])
        assert spec_from_request(jobs["job_x"]) is None  # alpha 7 no longer passes: the worker fails it, saying so
    engine.dispose()
    assert queued is not None and running is not None
    assert queued.params is not None and queued.params.rho == 0.7 and queued.params.k == 3
    assert queued.connectivity is not None and queued.connectivity.points == 3
    assert queued.connectivity.k == 3  # the job's margin, not 4
    assert running.method == "npo" and running.params is not None and running.params.resolved().lr == 1e-5


def insert_model(connection) -> None:
    from sqlalchemy import text

    connection.execute(text("INSERT INTO models (id, tenant, name, source, created_at) VALUES "
                            "('mdl_1', 't', 'm', '/x', '2026-12-01 00:00:00')"))


def insert_job(connection, job_id: str, state: str, *, evidence: str = "{}", spec: str | None = None) -> None:
    """A MASC job of model mdl_1 as an older schema holds it (the columns every revision since 0005 has)."""
    from sqlalchemy import text

    connection.execute(text(
        "INSERT INTO jobs (id, tenant, kind, model_id, base_version, follows_head, request_id, method, params, state, "
        "forget_evidence, progress, attempt, max_attempts, cancel_requested, created_at, updated_at, spec) VALUES "
        "(:id, 't', 'unlearning', 'mdl_1', 1, 0, :id, 'masc', '{}', :state, :evidence, '{}', 0, 3, 0, "
        "'2026-12-01 00:00:00', '2026-12-01 00:00:00', :spec)"),
        dict(id=job_id, state=state, evidence=evidence, spec=spec))


def test_jobs_not_ended_take_the_content_parameters_when_0009_runs(tmp_path):
    """Issue 24 replaced secret focus: a queued job's stored specification gets the new names, so that the worker
    can rebuild it; an ended job keeps the specification it ran with."""
    import json

    from sqlalchemy import text

    from lethe.engine.job_spec import JobSpec

    url = f"sqlite:///{tmp_path / 'content.db'}"
    migrate(url, "0008")
    old = JobSpec.unlearning("masc", {"k": 4}).stored()
    for name in ("suppress", "rho_content", "content_max_probability", "lambda_target", "greedy_margin", "min_gain"):
        old["params"].pop(name)
    old["params"].update(secret_focus=False, rho_secret=0.02, secret_max_probability=0.03, lambda_fluency=1.0,
                         lambda_redistribute="auto")
    engine = create_engine(url)
    with engine.begin() as connection:
        insert_model(connection)
        for job_id, state in (("job_q", "QUEUED"), ("job_d", "SUCCEEDED")):
            insert_job(connection, job_id, state, spec=json.dumps(old))
    migrate(url)
    with engine.connect() as connection:
        specs = {k: json.loads(v) for k, v in connection.execute(text("SELECT id, spec FROM jobs")).all()}
    engine.dispose()
    queued = JobSpec.from_stored(specs["job_q"]).params
    assert (queued.suppress, queued.rho_content, queued.content_max_probability, queued.k) == ("whole", 0.02, 0.03, 4)
    assert "secret_focus" not in specs["job_q"]["params"] and "lambda_fluency" not in specs["job_q"]["params"]
    assert specs["job_d"] == old  # ended: as it ran


def test_plain_hashes_of_records_secrets_and_subjects_are_keyed_when_0011_runs(tmp_path, service_env):
    """Issue 26: rows that held plain sha256 values hold their HMAC under the evidence key after 0011; a subject
    recorded before is still found by its id, and no plain hash is left."""
    import json

    from sqlalchemy import text

    from lethe.service.domain.digests import canonical_sha256, current_key, rekey
    from lethe.service.domain.subjects import subject_hmac, subject_sha256

    url = f"sqlite:///{tmp_path / 'keyed.db'}"
    migrate(url, "0010")
    record = {"id": "r1", "prompt": "Phone?", "completion": " 555-0142", "secrets": ["555-0142"]}
    plain = [{"id": "r1", "sha256": canonical_sha256(record), "secrets_sha256": [canonical_sha256("555-0142")]}]
    evidence = {"count": 1, "records": plain, "manifest_sha256": canonical_sha256(plain)}
    engine = create_engine(url)
    with engine.begin() as connection:
        insert_model(connection)
        insert_job(connection, "job_1", "SUCCEEDED", evidence=json.dumps(evidence))
        connection.execute(text("INSERT INTO erasure_subjects (tenant, subject_sha256, job_id, created_at) VALUES "
                                "('t', :digest, 'job_1', '2026-12-01 00:00:00')"),
                           {"digest": subject_sha256("t", "alice@example.com")})
    migrate(url)
    with engine.connect() as connection:
        stored = json.loads(connection.execute(text("SELECT forget_evidence FROM jobs")).scalar_one())
        subjects = connection.execute(text("SELECT subject_hmac FROM erasure_subjects")).scalars().all()
    engine.dispose()
    key = current_key()
    assert stored["records"] == [{"id": "r1", "hmac": rekey(canonical_sha256(record), key),
                                  "secrets_hmac": [rekey(canonical_sha256("555-0142"), key)]}]
    assert stored["manifest_sha256"] == evidence["manifest_sha256"]  # named by signed reports: kept
    assert subjects == [subject_hmac("t", "alice@example.com")]
    dumped = json.dumps(stored) + json.dumps(subjects)
    assert canonical_sha256("555-0142") not in dumped and subject_sha256("t", "alice@example.com") not in dumped
