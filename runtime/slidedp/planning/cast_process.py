"""The host cast planned in a process of its own, beside the GPU cast.

With `policy.delivery_cast: auto` a bf16 GPU job is planned twice, once per cast (autopolicy._cast_choice), and the
two searches share nothing: each is about half of the planning (1.0-1.5 s each for Qwen3-4B clipped under 24 GiB).
A run's launcher therefore starts `CastProcess` when it starts (a fresh interpreter that imports the planner while
the launcher detects the host and checks the request), hands it the host cast's search when the planning begins and
plans the GPU cast itself meanwhile. The plan is the one the two searches give one after the other: the same code on
the same inputs (the job, the topology and the calibration travel pickled, floats exactly), and the choice between
the casts is still made by the caller.

Used once, for the run's first plan, by train() alone (slidedp.launch): the card sweep (`slidedp plan`, the web
preview) keeps the chosen cast's planner and is planned in one process. Anything wrong with the process (it could
not start, died, or raised) is logged and the host cast is planned in the caller instead, so the plan never depends
on it. Imports no torch.
"""

from __future__ import annotations

import logging
from typing import Any

from slidedp.ranks import Launch, RankFailed, RankLink

log = logging.getLogger(__name__)
TARGET = "slidedp.planning.cast_process:plan_host_cast"
CONNECT_TIMEOUT_S = 2.0  # a process not connected by the time the plan starts is far behind: planned here instead
# How long the caller waits for the process once its own search is done, in that search's times (at least
# MIN_WAIT_S): the two searches take about as long, so one three times longer has gone wrong, and the cast is
# planned here instead.
WAIT_FACTOR, MIN_WAIT_S = 3.0, 10.0


class CastProcess:
    """A planning process started now and given one search later (`submit`, then `result`); `close()` ends it,
    used or not."""

    def __init__(self) -> None:
        self._launch: Launch | None = None
        self.answered = False  # the process gave its plan
        try:
            self._launch = Launch(TARGET, 1, prefix="slidedp-plan-", log=True)
            self._launch.spawn()
        except OSError as exc:  # no process could be started (out of file descriptors, PIDs): planned in one
            log.warning("planning in one process: the host cast's process did not start (%s)", exc)
            self.close()

    @property
    def free(self) -> bool:
        """Started and not given its search yet."""
        return self._launch is not None and not self._launch.args_sent

    def submit(self, cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None,
               fewer_slots: bool) -> bool:
        """Hand the host cast of this job to the process; False (and the process ended) where it cannot take it."""
        if not self.free:
            return False
        try:
            self._launch.start((cfg, topology, calibration, fewer_slots), connect_timeout_s=CONNECT_TIMEOUT_S)
        except (RankFailed, OSError) as exc:
            log.warning("planning the host cast here: its process could not take it (%s)", exc)
            self.close()
            return False
        return True

    def result(self, own_search_s: float) -> Any | None:
        """The host cast's Plan from the process, or None (logged, the process ended) where it gave none within
        WAIT_FACTOR times the caller's own search (`own_search_s`, at least MIN_WAIT_S)."""
        if self._launch is None or not self._launch.args_sent:
            return None
        try:
            plan = self._launch.results(max(MIN_WAIT_S, WAIT_FACTOR * own_search_s), grace_s=1.0)[0]
            self.answered = True
            return plan
        except RankFailed as exc:
            log.warning("planning the host cast here: its process gave no plan (%s)", exc)
            return None
        finally:
            self.close()

    def close(self) -> None:
        if self._launch is not None:
            self._launch.close()
            self._launch = None


def plan_host_cast(args: tuple[Any, dict[str, Any], dict[str, Any] | None, bool], link: RankLink) -> Any:
    """The process's side: the host cast's plan of the job, as autopolicy._cast_choice would make it."""
    from slidedp.planning import autopolicy

    cfg, topology, calibration, fewer_slots = args
    return autopolicy.host_cast_plan(cfg, topology, calibration, fewer_slots)


def prepare() -> None:
    """Run by the process while it waits for its search: the planner imported before it is needed."""
    import slidedp.planning.autopolicy  # noqa: F401
