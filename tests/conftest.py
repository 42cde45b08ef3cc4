import os
import sys
import uuid
from pathlib import Path

# Lightning gives its logger a handler on the sys.stderr of the moment it is first imported. Imported
# here, that is the session's stream; first imported inside a test that uses capsys, it would be that
# test's stream, closed after it, and a later test's Lightning message would print a "Logging error"
# traceback into whatever that test captures (test_cli_faults after test_cli_train did).
import lightning.pytorch  # noqa: F401
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (wandb_offline)

# The tests' models are tiny: one thread is faster than two, and it keeps the suite's speed
# independent of whatever else shares the CPU.
torch.set_num_threads(1)

PG_ENV = "VAPO_LIT_TEST_PG_URL"
"""A PostgreSQL URL whose role may CREATE DATABASE (.ci/run starts a server and sets it)."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _unavailable(reason: str):
    """In CI a missing PostgreSQL server is a failure (the backend must be tested); locally a skip."""
    if in_ci():
        pytest.fail(f"CI=true but PostgreSQL is not usable: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL not available: {reason}")


def fresh_pg_database():
    """Create an empty database on the server of $VAPO_LIT_TEST_PG_URL; yield its URL; drop it."""
    import sqlalchemy

    from vapo_lit.ablate.store import mask_text, mask_url

    url = os.environ.get(PG_ENV)
    if not url:
        _unavailable(f"${PG_ENV} is not set (e.g. postgresql://user:pass@127.0.0.1:5432/postgres)")
    try:
        admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
        with admin.connect() as c:
            c.execute(sqlalchemy.text("SELECT 1"))
    except Exception as e:  # noqa: BLE001 - no driver, no server, bad password: all "unavailable"
        _unavailable(
            f"cannot connect to {mask_url(url)}: {type(e).__name__}: {mask_text(e, url)}".splitlines()[0]
        )
    name = f"vapo_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sqlalchemy.engine.make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path):
    """The grid tests' shared storage: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        yield from fresh_pg_database()


@pytest.fixture
def pg_url():
    """A fresh PostgreSQL database (skipped locally without a server; a failure under CI=true)."""
    yield from fresh_pg_database()
