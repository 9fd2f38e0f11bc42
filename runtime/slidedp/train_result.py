"""What `slidedp.train` answers: its result, and the errors a run ends with besides a bad config (ConfigError).
slidedp.launch re-exports them; docs/interfaces.md §2 describes them."""

from __future__ import annotations

from dataclasses import dataclass, field

from slidedp.policy import ExecutionPolicy


class TrainError(RuntimeError):
    """A rank failed; the message carries its traceback."""


class UnhealthyRun(TrainError):
    """The run diverged (a non-finite loss or gradient norm), or raised a health warning with on_warning: stop.
    The message is the reason; nothing was written from the state after `step`."""

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step

    def __reduce__(self):
        return (type(self), (str(self), self.step))


class ExportFailed(TrainError):
    """Every step was trained but the Hugging Face export failed (a full disk, most often).

    checkpoint: the complete checkpoint of the last step that holds the trained state (`slidedp export
    --checkpoint PATH` retries the export from it), or None when none could be kept; export_error: the
    slidedp.persist.export.ExportError (needed_bytes, free_bytes, directory)."""

    def __init__(self, message: str, checkpoint: str | None, export_error: BaseException):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.export_error = export_error

    def __reduce__(self):
        return (type(self), (str(self), self.checkpoint, self.export_error))


@dataclass
class TrainResult:
    status: str  # "completed" | "stopped"
    steps_done: int
    metrics: list[dict] = field(default_factory=list)
    output_dir: str = ""
    final_dir: str | None = None
    checkpoint_dir: str | None = None
    policy: ExecutionPolicy | None = None  # the policy the ranks ran with
    plan: dict = field(default_factory=dict)  # AutoPolicy's plan it was resolved from ({}: nothing was planned)
    exported_files: list[dict] = field(default_factory=list)  # [{"name", "bytes"}] written into final_dir
    warnings: list[dict] = field(default_factory=list)  # health warnings raised: [{"step", "kind", "message"}]
    # the steady steps against the plan's prediction (slidedp.planning.observed.prediction_check); None: no check
    prediction_check: dict | None = None
