"""Service settings, read from the environment (and a .env file) with pydantic-settings.

Every process of the workbench (API, worker, the per-job process) builds the same Settings from the same
environment, so one set of variables configures a deployment:

    SLIDEDP_DATA_DIR=/srv/slidedp DATABASE_URL=postgresql+psycopg://... REDIS_URL=redis://... slidedp worker
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SLIDEDP_", env_file=".env", extra="ignore", populate_by_name=True
    )

    data_dir: Path = Field(Path(".slidedp"), description="Where the SQLite file, job outputs and logs live.")
    database_url: Optional[str] = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "SLIDEDP_DATABASE_URL", "database_url"),
        description="SQLAlchemy URL; default: a SQLite file in the data directory.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "SLIDEDP_REDIS_URL", "redis_url"),
        description="Broker of the job queue and carrier of live events (redis:// or unix:///path.sock).",
    )
    api_token: Optional[str] = Field(
        None,
        description="When set, /api requires 'Authorization: Bearer <token>'. Unset on a non-loopback bind, "
        "`slidedp serve` makes one up and prints a login URL (see access_for_bind).",
    )
    insecure: bool = Field(
        False,
        description="Serve a non-loopback bind without a token (what `slidedp serve --insecure` sets): anyone "
        "who reaches the port can submit jobs.",
    )
    public_url: Optional[str] = Field(
        None,
        description="Base URL of the printed login link (default http://<host>:<port>), e.g. the address a "
        "container's port is published on.",
    )
    ticket_ttl_s: float = Field(
        60.0, gt=0, description="Lifetime of a ticket from POST /api/tickets (one GET of one path)."
    )
    max_tickets: int = Field(
        1000, gt=0, description="Tickets outstanding at once in one API process; more are refused with 429."
    )
    host: str = Field("127.0.0.1", description="Address the API binds; loopback unless told otherwise.")
    port: int = Field(8000, description="Port the API binds.")
    host_name: str = Field(
        default_factory=socket.gethostname, description="Name this machine reports as a worker host."
    )
    worker_queue: Optional[str] = Field(
        None, description="Queue of this host's worker (default slidedp-<host>)."
    )
    frontend_dir: Optional[Path] = Field(
        None,
        description="Built UI to serve at / (default: the one in the installed package, else frontend/dist).",
    )
    calibration_dir: Optional[Path] = Field(
        None,
        description="Where this workbench's jobs and plans cache this host's calibrations, which the worker "
        "reports (default: calibration/ in the data directory; the slidedp CLI keeps its own cache).",
    )
    host_ram_gib: Optional[float] = Field(
        None, description="Host RAM to report instead of the detected figure."
    )

    # Limits
    max_queued_jobs: int = Field(100, description="Job creation answers 429 beyond this many queued jobs.")
    plan_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A plan preview (POST /api/plan, POST /api/jobs) still running after this many seconds is "
        "stopped and answered 503.",
    )
    max_page_size: int = Field(500, description="Largest `limit` accepted by list endpoints.")
    max_log_line_chars: int = Field(4000, description="Longer log lines are cut to this length.")
    max_request_bytes: int = Field(
        1 << 20, description="Larger request bodies are refused with 413 before they are read."
    )

    # Guards (slidedp_web/guards.py)
    model_roots: Optional[str] = Field(
        None,
        description="Colon-separated folders that model directories must lie in (unset: anywhere the "
        "server can read).",
    )
    data_roots: Optional[str] = Field(
        None,
        description="Colon-separated folders that dataset files must lie in (unset: anywhere the server "
        "can read).",
    )
    output_roots: Optional[str] = Field(
        None,
        description="Colon-separated folders a job's output_dir must lie in (a relative one is taken under the "
        "first); the data directory is not exempt, except each job's own folder (unset: anywhere the server can "
        "write).",
    )
    allow_any_path: bool = Field(
        False,
        description="On a non-loopback bind, leave the roots that are not set unset (what `slidedp serve "
        "--allow-any-path` sets): whoever may call the API can then train on any file the server can read and "
        "read it back through generation. Without it such a bind confines them to the data folder "
        "(roots_for_bind).",
    )
    log_format: str = Field(
        "text", description="'json': one JSON object per log record (ts, level, logger, msg, job_id)."
    )

    # Timing: why each figure is what it is lives in docs/interfaces.md §6.
    heartbeat_s: float = Field(5.0, description="How often a running job's supervisor writes its heartbeat.")
    heartbeat_timeout_s: float = Field(
        60.0, description="A running job whose heartbeat is older than this is marked interrupted."
    )
    host_report_s: float = Field(
        30.0, description="How often a worker reports its host (topology, last_seen)."
    )
    cancel_grace_s: float = Field(
        60.0,
        description="After a cancel, how long a job may take to reach a step boundary before it is killed.",
    )
    watchdog_s: float = Field(2.0, description="How often the API checks Redis and stale heartbeats.")
    broker_visibility_timeout_s: float = Field(
        3600.0,
        description="Redis visibility timeout. Jobs are acknowledged when they start, so it only governs "
        "messages a worker received but had not started when it died.",
    )

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            url = self.database_url
            # Plain postgresql:// means psycopg 3 here (the driver the web extra installs).
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url[len("postgresql://") :]
            elif url.startswith("postgres://"):
                url = "postgresql+psycopg://" + url[len("postgres://") :]
            return url
        return f"sqlite:///{(self.data_dir / 'slidedp.db').resolve()}"

    @property
    def queue(self) -> str:
        return self.worker_queue or f"slidedp-{self.host_name}"

    @property
    def broker_url(self) -> str:
        """Celery/kombu spell a unix socket redis+socket://; redis-py spells it unix://."""
        if self.redis_url.startswith("unix://"):
            return "redis+socket://" + self.redis_url[len("unix://") :]
        return self.redis_url

    @property
    def jobs_dir(self) -> Path:
        return (self.data_dir / "jobs").resolve()

    @property
    def calibration_path(self) -> Path:
        if self.calibration_dir:
            return self.calibration_dir
        # A workbench's calibrations are its own: another workbench's (or the CLI's, in ~/.cache or wherever
        # SLIDEDP_CACHE_DIR points) were measured for other models, or while other work loaded the host.
        return (self.data_dir / "calibration").resolve()

    def env(self) -> dict[str, str]:
        """These settings as environment variables, for the processes a command starts."""
        out = {
            "SLIDEDP_DATA_DIR": str(self.data_dir.resolve()),
            "DATABASE_URL": self.sqlalchemy_url,
            "REDIS_URL": self.redis_url,
            "SLIDEDP_HOST_NAME": self.host_name,
            "SLIDEDP_WORKER_QUEUE": self.queue,
            # where a job's own calibration is cached (the runtime's cache dir), so the worker reports it
            "SLIDEDP_CACHE_DIR": str(self.calibration_path),
        }
        for name in (
            "api_token",
            "frontend_dir",
            "calibration_dir",
            "host_ram_gib",
            "heartbeat_s",
            "heartbeat_timeout_s",
            "host_report_s",
            "cancel_grace_s",
            "watchdog_s",
            "broker_visibility_timeout_s",
            "max_queued_jobs",
            "max_page_size",
            "max_log_line_chars",
            "max_request_bytes",
            "model_roots",
            "data_roots",
            "output_roots",
            "allow_any_path",
            "log_format",
        ):
            value = getattr(self, name)
            if value is not None:
                out["SLIDEDP_" + name.upper()] = str(value)
        return out


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


# ---- Who may call the API: the one decision every entry point takes (slidedp serve, its --api-only mode in the
# container, and require_token for a plain `uvicorn slidedp_web.main:app`).

TOKEN_FILE = "api-token"  # in the data directory, 0600, while a generated token is in force


def is_loopback(host: Optional[str]) -> bool:
    """True when `host` (a bind or socket address) is reachable from this machine only.

    An IP literal is judged by its value (127.0.0.0/8, ::1, and IPv4-mapped ::ffff:127.x); "localhost" is
    loopback; any other name, the wildcards 0.0.0.0 / :: and an empty host are not (a name may resolve to an
    outside address, so it is treated as one).
    """
    if host is None:
        return False
    name = host.strip().strip("[]").split("%", 1)[0]
    if name.lower() in ("localhost", "localhost.", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


@dataclass(frozen=True)
class Access:
    """What the API requires of its callers for one bind."""

    token: Optional[str]  # the bearer token required; None: the API answers without one
    generated: bool  # made up now, for this run only
    loopback: bool  # the bind reaches this machine only
    insecure: bool  # a non-loopback bind left open on purpose (--insecure / SLIDEDP_INSECURE=1)


def access_for_bind(host: str, api_token: Optional[str], insecure: bool = False) -> Access:
    """The token that applies to an API bound to `host`.

    A configured SLIDEDP_API_TOKEN always applies. Without one, a loopback bind stays open (the machine's own
    users, as before); a non-loopback bind gets a random token for this run (secrets.token_urlsafe) unless
    `insecure` says to leave it open.
    """
    loopback = is_loopback(host)
    if api_token:
        return Access(api_token, generated=False, loopback=loopback, insecure=False)
    if loopback:
        return Access(None, generated=False, loopback=True, insecure=False)
    if insecure:
        return Access(None, generated=False, loopback=False, insecure=True)
    return Access(secrets.token_urlsafe(32), generated=True, loopback=False, insecure=False)


# Where a network bind's jobs may read and write when the operator named no folders: the data folder's own.
DEFAULT_ROOTS = {"model_roots": "models", "data_roots": "datasets", "output_roots": "jobs/named"}


def roots_for_bind(settings: Settings, host: str) -> dict[str, Path]:
    """The roots to set for a bind, {setting name: folder}: on a non-loopback bind each of model_roots,
    data_roots and output_roots left unset gets its folder in the data folder (models/, datasets/, jobs/named/,
    where relative output folders go anyway); {} on loopback (this machine's own users, unconfined as before)
    or with allow_any_path.

    Without roots a caller of the API could train on any text or JSON file the server can read and have it
    repeated back by generation; a token only says who the caller is, not what they may read."""
    if is_loopback(host) or settings.allow_any_path:
        return {}
    data = settings.data_dir.resolve()
    return {name: data / folder for name, folder in DEFAULT_ROOTS.items() if not getattr(settings, name)}


def base_url(host: str, port: int, public_url: Optional[str] = None) -> str:
    """Where a browser reaches the API: SLIDEDP_PUBLIC_URL, else the bind (a wildcard bind: this machine's name)."""
    if public_url:
        return public_url.rstrip("/")
    name = host.strip().strip("[]")
    if name in ("0.0.0.0", "::", ""):
        name = socket.gethostname()
    elif ":" in name:
        name = f"[{name}]"
    return f"http://{name}:{port}"


def login_url(base: str, token: str) -> str:
    """The UI's login link: the token rides in the fragment, which browsers never send to a server."""
    return f"{base.rstrip('/')}/#token={token}"
