"""Database engine, sessions and schema migrations (Alembic, applied when a process starts).

SQLite is shared by several processes (API, worker, the per-job process). In WAL mode a transaction that
read first and writes later fails at once with SQLITE_BUSY when another process wrote in between, so every
write goes through ``write_session()``, which takes the write lock up front (BEGIN IMMEDIATE) and waits for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlmodel import Session

from slidedp_web.core.config import Settings

_engines: dict[str, sa.Engine] = {}
_engines_lock = threading.Lock()
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def get_engine(settings: Settings) -> sa.Engine:
    url = settings.sqlalchemy_url
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = _create_engine(url)
        return engine


def _create_engine(url: str) -> sa.Engine:
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True)
    path = sa.engine.make_url(url).database
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no branch - runs once per connection
        # Let SQLAlchemy's "begin" event emit BEGIN itself (the pysqlite driver's own BEGIN is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN " + conn.get_execution_options().get("sqlite_begin", "DEFERRED"))

    return engine


@contextlib.contextmanager
def read_session(settings: Settings) -> Iterator[Session]:
    with Session(get_engine(settings), expire_on_commit=False) as session:
        yield session


@contextlib.contextmanager
def write_session(settings: Settings) -> Iterator[Session]:
    """A session whose transaction holds the database's write lock from its first statement; commits on exit."""
    with Session(get_engine(settings), expire_on_commit=False) as session:
        session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
        yield session
        session.commit()


def ping(settings: Settings) -> bool:
    try:
        with get_engine(settings).connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - health reports any failure as "database down"
        return False


def upgrade(settings: Settings) -> None:
    """Bring the schema to the newest migration. Safe when several processes start at once."""
    from alembic import command
    from alembic.config import Config

    engine = get_engine(settings)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", settings.sqlalchemy_url.replace("%", "%%"))
    with _migration_lock(settings, engine):
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")


@contextlib.contextmanager
def _migration_lock(settings: Settings, engine: sa.Engine) -> Iterator[None]:
    if engine.dialect.name == "postgresql":
        key = zlib.crc32(b"slidedp-migrations")
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
        return
    path = sa.engine.make_url(settings.sqlalchemy_url).database
    if not path or path == ":memory:":
        yield
        return
    with open(path + ".migrate.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
