"""Tables and public shapes of the workbench (the database is the source of truth; Redis only carries).

Family pattern: ``X(table=True)`` is the row, ``XPublic`` what the API answers. Per-job rows (status history,
metrics, log lines, events) are keyed by (job_id, sequence) so readers page through them with a cursor.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal, Optional

import sqlalchemy as sa
from pydantic import computed_field
from slidedp import trackers
from sqlmodel import Field, SQLModel

JobStatus = Literal["queued", "running", "completed", "failed", "cancelled", "interrupted"]
TERMINAL_STATUSES = ("completed", "failed", "cancelled", "interrupted")
RESUMABLE_STATUSES = ("failed", "cancelled", "interrupted")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(ts: Optional[datetime]) -> Optional[datetime]:
    """SQLite hands back naive datetimes; every timestamp stored here is UTC."""
    if ts is None:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def iso(ts: Optional[datetime]) -> Optional[str]:
    ts = as_utc(ts)
    return ts.isoformat().replace("+00:00", "Z") if ts else None


def _ts(nullable: bool = True, index: bool = False) -> Any:
    return Field(
        default=None, sa_column=sa.Column(sa.DateTime(timezone=True), nullable=nullable, index=index)
    )


def _json(nullable: bool = True) -> Any:
    return Field(default=None, sa_column=sa.Column(sa.JSON, nullable=nullable))


class JobRecord(SQLModel, table=True):
    """A submitted job as the workbench stores it: its config, where and how far it runs, what it planned and what
    became of it (the row of `jobs`; JobPublic is what the API answers of it). Not the runtime's description of a
    workload to plan (slidedp.planning's Job)."""

    __tablename__ = "jobs"
    # An id is never handed out twice (a deleted job's URLs, tickets and event cursors must not reach a new job):
    # SQLite's AUTOINCREMENT (migration 0005); Postgres's sequence never goes back.
    __table_args__ = {"sqlite_autoincrement": True}

    id: Optional[int] = Field(default=None, primary_key=True)
    name: Optional[str] = Field(default=None, max_length=200)
    status: str = Field(default="queued", max_length=16, index=True)
    config: dict = Field(sa_column=sa.Column(sa.JSON, nullable=False))
    queue: str = Field(max_length=200)
    host: Optional[str] = Field(default=None, max_length=200)
    # The plan made at submit time ("stage": "planned" or "unplanned"), after a run the plan it ran with its resolved
    # policy ("stage": "resolved"); planning.job_policy reads it as the API answers it (JobPublic.policy). Its column
    # keeps the name the schema has always given it.
    plan: Optional[dict] = Field(default=None, sa_column=sa.Column("policy", sa.JSON, nullable=True))
    created_at: Optional[datetime] = _ts(nullable=False)
    started_at: Optional[datetime] = _ts()
    finished_at: Optional[datetime] = _ts()
    heartbeat_at: Optional[datetime] = _ts()
    step: int = 0
    steps: int = 0
    last_metrics: Optional[dict] = _json()
    error: Optional[dict] = _json()
    output_dir: str = Field(max_length=4096)
    # Each (re)submission is one attempt; a queue message names its attempt, so a stale or duplicated
    # message can never claim a later attempt (see tasks.claim).
    attempt: int = 1
    cancel_request: Optional[str] = Field(default=None, max_length=8)  # "stop" | "save"
    cancel_requested_at: Optional[datetime] = _ts()
    event_seq: int = 0  # last SSE id handed out for this job
    log_seq: int = 0  # last log line number
    # Ownership of the output folder (slidedp_web/outputs.py): the token the worker writes into the folder's
    # owner marker, and what the job created there (folders, the export's files), which is all DELETE removes
    # and all the export download serves. None: a job recorded before ownership was (its folder is unmarked).
    owner_token: Optional[str] = Field(default=None, max_length=64)
    outputs: Optional[dict] = _json()
    # The job whose checkpoint this one starts from (init_from), so that the source is not deleted under it.
    init_from_job: Optional[int] = Field(default=None, index=True)
    # What the next attempt does: "train" (train, or resume from the newest checkpoint) or "export" (write
    # final/ from the newest checkpoint, which holds the last step: POST /api/jobs/{id}/export).
    action: str = Field(default="train", max_length=16)
    # Health warnings the job's steps raised (slidedp.health), oldest first: [{"step", "kind", "message"}].
    warnings: Optional[list] = _json()
    # Where the current attempt's start-up is (slidedp.startup): {"stage", "elapsed_s", ...}; "training" once
    # its first step is done, with the stages' durations.
    stage: Optional[dict] = _json()


class StatusChange(SQLModel, table=True):
    __tablename__ = "job_status_history"
    __table_args__ = (sa.Index("ix_job_status_history_job", "job_id", "id"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    job_id: int
    status: str = Field(max_length=16)
    attempt: int = 1
    ts: Optional[datetime] = _ts(nullable=False)
    message: Optional[str] = None


class Metric(SQLModel, table=True):
    __tablename__ = "job_metrics"
    __table_args__ = (sa.UniqueConstraint("job_id", "step", name="uq_job_metrics_job_step"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    job_id: int
    step: int
    ts: Optional[datetime] = _ts(nullable=False)
    data: dict = Field(sa_column=sa.Column(sa.JSON, nullable=False))


class LogLine(SQLModel, table=True):
    __tablename__ = "job_logs"
    __table_args__ = (sa.UniqueConstraint("job_id", "seq", name="uq_job_logs_job_seq"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    job_id: int
    seq: int
    ts: Optional[datetime] = _ts(nullable=False)
    line: str


class Event(SQLModel, table=True):
    """One SSE event; (job_id, seq) is the event id a client resumes from (Last-Event-ID)."""

    __tablename__ = "job_events"
    __table_args__ = (sa.UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    job_id: int
    seq: int
    kind: str = Field(max_length=16)  # metrics | status | log
    ts: Optional[datetime] = _ts(nullable=False)
    data: dict = Field(sa_column=sa.Column(sa.JSON, nullable=False))


class Host(SQLModel, table=True):
    """A worker host: what it reported about itself and when it last did."""

    __tablename__ = "hosts"

    name: str = Field(primary_key=True, max_length=200)
    queue: str = Field(max_length=200)
    topology: Optional[dict] = _json()
    calibration: Optional[dict] = _json()
    started_at: Optional[datetime] = _ts()
    last_seen: Optional[datetime] = _ts()
    current_job_id: Optional[int] = None


GenerationStatus = Literal["queued", "running", "done", "failed"]


class Generation(SQLModel, table=True):
    """A prompt for a job's trained model (its export, or one of its checkpoints converted), answered on the job's
    host through the job's queue (slidedp_web/generations.py, generation_process.py)."""

    __tablename__ = "generations"

    id: Optional[int] = Field(default=None, primary_key=True)
    job_id: int = Field(index=True)
    status: str = Field(default="queued", max_length=16)
    queue: str = Field(max_length=200)
    host: Optional[str] = Field(default=None, max_length=200)
    prompt: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    checkpoint: Optional[str] = Field(default=None, max_length=32)  # None: the job's export (final/)
    formatted_prompt: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    text: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    # {"format", "prompt_tokens", "new_tokens", "stop", "model_dir", "converted"} once answered
    result: Optional[dict] = _json()
    timings: Optional[dict] = _json()  # {"queued_s", "convert_s", "load_s", "generate_s", "total_s", ...}
    error: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    created_at: Optional[datetime] = _ts(nullable=False)
    started_at: Optional[datetime] = _ts()
    finished_at: Optional[datetime] = _ts()


# ------------------------------------------------------------------------------------------ public shapes
class JobError(SQLModel):
    message: str
    errors: list[dict[str, Any]] = []
    # why the run ended, where the runtime said: "diverged" (a non-finite number, or a dead run: health.on_dead)
    # or "health_stop" (a warning with health.on_warning: stop); `step` the step it went wrong at
    reason: Optional[str] = None
    step: Optional[int] = None


class JobPublic(SQLModel):
    id: int
    name: Optional[str]
    status: JobStatus
    config: dict[str, Any]
    host: Optional[str]
    policy: Optional[dict[str, Any]]
    created_at: Optional[str]
    started_at: Optional[str]
    finished_at: Optional[str]
    step: int
    steps: int
    last_metrics: Optional[dict[str, Any]]
    error: Optional[JobError]
    eta_s: Optional[float]
    tokens_per_s: Optional[float]
    output_dir: str
    checkpoints: list[str]
    warnings: list[dict[str, Any]] = []
    stage: Optional[dict[str, Any]] = None
    cancel_request: Optional[Literal["stop", "save"]] = None
    cancel_requested_at: Optional[str] = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tensorboard_events(self) -> bool:
        """Whether output_dir/tensorboard holds event files as this server sees the folder: the job page names the
        folder and its `tensorboard --logdir` command only then (the default tracker writes none without its
        package, and the folder may not exist)."""
        return trackers.tensorboard_events(self.output_dir)


class JobSummary(SQLModel):
    """What tells runs apart in the jobs list (slidedp_web/job_summary.py); null where the job has no such figure."""

    final_loss: Optional[float] = None
    final_eval_loss: Optional[float] = None
    final_eval_step: Optional[int] = None
    median_tokens_per_s: Optional[float] = None
    duration_s: Optional[float] = None


class JobListItem(JobPublic):
    summary: JobSummary


class JobList(SQLModel):
    items: list[JobListItem]
    total: int


class MetricsList(SQLModel):
    items: list[dict[str, Any]]


class LogItem(SQLModel):
    seq: int
    ts: str
    line: str


class LogList(SQLModel):
    items: list[LogItem]


class CheckpointPublic(SQLModel):
    name: str
    step: Optional[int]
    bytes: int
    path: str


class CheckpointList(SQLModel):
    items: list[CheckpointPublic]


class HostPublic(SQLModel):
    name: str
    queue: str
    topology: dict[str, Any]
    calibration: Optional[dict[str, Any]]
    last_seen: Optional[str]
    online: bool


class HostList(SQLModel):
    items: list[HostPublic]


class CancelRequest(SQLModel):
    save: bool = False


class Health(SQLModel):
    status: Literal["ok", "degraded"]
    database: bool
    redis: bool
    workers: int


class PresetPublic(SQLModel):
    id: str
    label: str
    description: str
    config: dict[str, Any]


class PresetList(SQLModel):
    items: list[PresetPublic]


class GenerationPublic(SQLModel):
    id: int
    job_id: int
    status: GenerationStatus
    url: str  # where to poll it
    prompt: str
    max_new_tokens: int
    temperature: float
    seed: int
    checkpoint: Optional[str]
    host: Optional[str]
    waiting: Optional[str] = None  # while queued: what it waits for, in words
    waiting_for_job: Optional[int] = None  # while queued behind a running job: that job's id
    formatted_prompt: Optional[str] = None
    text: Optional[str] = None
    format: Optional[str] = None
    prompt_tokens: Optional[int] = None
    new_tokens: Optional[int] = None
    stop: Optional[Literal["eos", "length"]] = None
    note: Optional[str] = None  # why an answer is empty or cut short, and what to try (slidedp.generate.explain)
    error: Optional[str] = None
    created_at: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    timings: dict[str, Optional[float]] = {}
