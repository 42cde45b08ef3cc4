"""Storage URLs: the password put in from outside the command line, the database driver found or named.

Passwords. A password written into ``--storage postgresql://user:PASS@host/db`` is visible to
anyone running `ps` on that machine. Keep it out of the command line: `VAPO_LIT_STORAGE_PASSWORD`
(environment) or ``--storage-password-file PATH`` (first line of the file) is put into the URL
inside the process; PostgreSQL's own ``PGPASSWORD`` and ``~/.pgpass`` work too (libpq reads them).
Wherever a URL or an error text is printed or recorded it goes through `vapo_lit.masking`
(`mask_text` / `mask_url`), and `scrub_argv` masks any URL password left in ``sys.argv`` before
W&B records it.

Drivers. SQLAlchemy 2.1 maps a plain ``postgresql://`` to psycopg 3 (``pip install
"psycopg[binary]"``, or ``pip install "vapo-lit[postgres]"``); ``postgresql+psycopg2://`` needs
``psycopg2-binary``. When only psycopg2 is installed, a plain ``postgresql://`` URL is opened with
it (`engine_url`), so both spellings work with either driver.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from vapo_lit.masking import mask_text, mask_url

PASSWORD_ENV = "VAPO_LIT_STORAGE_PASSWORD"

DRIVER_PACKAGES = {
    "psycopg": '"psycopg[binary]" (or "vapo-lit[postgres]")',
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "pymysql": "pymysql",
    "mysqldb": "mysqlclient",
    "mysqlconnector": "mysql-connector-python",
}
"""SQLAlchemy driver name -> the pip package that provides it."""


# ----------------------------------------------------------------------------- password sources
def with_password(url: str | None, password_file: str | os.PathLike | None = None) -> str | None:
    """`url` with the password from `password_file` or $VAPO_LIT_STORAGE_PASSWORD put in; ValueError
    if a password would be given twice or the file cannot be read."""
    if url is None:
        if password_file is not None:
            raise ValueError("--storage-password-file needs --storage (a database URL with a user)")
        return None
    password = None
    if password_file is not None:
        path = Path(password_file)
        try:
            password = path.read_text().splitlines()[0] if path.stat().st_size else ""
        except OSError as e:
            raise ValueError(f"--storage-password-file {path}: cannot read it ({e.strerror})") from None
        if not password:
            raise ValueError(
                f"--storage-password-file {path}: the file is empty (expected the password on line 1)"
            )
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    if password is None:
        return url
    import sqlalchemy

    try:
        u = sqlalchemy.engine.make_url(url)
    except Exception:  # noqa: BLE001 - check_url reports a bad URL with examples
        return url
    if u.password:
        where = "--storage-password-file" if password_file is not None else f"${PASSWORD_ENV}"
        raise ValueError(
            f"--storage {mask_url(url)} already holds a password; give it once (in {where} only)"
        )
    if u.get_backend_name() == "sqlite":
        return url
    return u.set(password=password).render_as_string(hide_password=False)


# ----------------------------------------------------------------------------- drivers
def engine_url(url: str) -> str:
    """The URL SQLAlchemy opens: a plain postgresql:// uses psycopg 3, or psycopg2 when only it is
    installed."""
    if (
        re.match(r"^postgres(ql)?://", url)
        and importlib.util.find_spec("psycopg") is None
        and importlib.util.find_spec("psycopg2") is not None
    ):
        return "postgresql+psycopg2://" + url.split("://", 1)[1]
    if url.startswith("postgres://"):  # Heroku-style spelling; SQLAlchemy wants postgresql://
        return "postgresql://" + url.split("://", 1)[1]
    return url


def check_url(url: str, creates: Path | None = None) -> None:
    """Parse the URL and load its driver; ValueError (password masked) if that fails. Writes nothing.
    A SQLite file's folder must exist, or be `creates` (the output folder the caller makes first)."""
    import sqlalchemy

    try:
        u = sqlalchemy.engine.make_url(engine_url(url))
        dialect = u.get_dialect()
    except Exception as e:  # noqa: BLE001 - any parse error is a bad URL
        raise ValueError(
            f"--storage {mask_url(url)}: not a valid database URL ({mask_text(e, url)}); "
            "examples: sqlite:///abs/path.db, postgresql://user@host:5432/db"
        ) from None
    try:
        dialect.import_dbapi() if hasattr(dialect, "import_dbapi") else dialect.dbapi()
    except ImportError:
        driver = getattr(dialect, "driver", "?")
        package = DRIVER_PACKAGES.get(driver, driver)
        hint = (
            " (SQLAlchemy maps a plain postgresql:// to psycopg 3; with psycopg2 installed it is used instead)"
            if u.get_backend_name() == "postgresql" and "+" not in url.split("://")[0]
            else ""
        )
        raise ValueError(
            f"--storage {mask_url(url)}: its database driver {driver!r} is not installed; "
            f"pip install {package}{hint}"
        ) from None
    if u.get_backend_name() == "sqlite":
        db = u.database
        if not db or db == ":memory:":
            raise ValueError(
                f"--storage {mask_url(url)}: an in-memory SQLite database cannot be shared by workers"
            )
        parent = Path(db).resolve().parent
        if not parent.is_dir() and (creates is None or parent != Path(creates).resolve()):
            made = f" (only --out {creates} is created)" if creates is not None else ""
            raise ValueError(f"--storage {mask_url(url)}: folder {parent} does not exist{made}")


def is_sqlite(url: str) -> bool:
    return str(url).startswith("sqlite")
