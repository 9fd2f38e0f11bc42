"""`slidedp worker`: the worker of one GPU host — a Celery worker on the host's own queue, one job at a time.

    SLIDEDP_DATA_DIR=/srv/slidedp DATABASE_URL=... REDIS_URL=redis://broker:6379/0 slidedp worker [--name gpu1]

At start it applies migrations, marks interrupted the jobs its previous life left running, and reports the
host's topology and calibration (again every SLIDEDP_HOST_REPORT_S). Each job runs in a freshly spawned
process (tasks.py). SIGTERM stops the running job at a step boundary with a checkpoint (resumable) and exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Optional

log = logging.getLogger("slidedp_web.worker")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="slidedp worker", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--name", help="host name to report (default: SLIDEDP_HOST_NAME or the machine's name)"
    )
    parser.add_argument("--queue", help="queue to consume (default: SLIDEDP_WORKER_QUEUE or slidedp-<name>)")
    parser.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO)")
    return parser.parse_args(argv)


def prepare(settings) -> None:
    """What a worker does before it takes jobs."""
    from slidedp_web import generations, hosts, jobs
    from slidedp_web.core.db import upgrade

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings)
    for job_id in jobs.interrupt_stale(settings, host_name=settings.host_name):
        log.warning("job %s was running when this worker last stopped: marked interrupted", job_id)
    for gen_id in generations.fail_leftovers(settings, settings.host_name):
        log.warning("generation %s was running when this worker last stopped: marked failed", gen_id)
    _clean_orphaned_host_state()
    hosts.report(settings, topology=hosts.local_topology(settings), started=True)


def _clean_orphaned_host_state() -> None:
    """Shared-memory host state outlives a killed job; the runtime removes segments whose owner is gone.

    It runs in a child process (the runtime's host-state module imports torch, which this worker process never
    does) and in the background (it only touches dead owners' segments, so a job may start meanwhile).
    """
    code = (
        "from slidedp.step.host_state import cleanup_orphans\n"
        "removed = cleanup_orphans()\n"
        "print('removed orphaned host state:', removed) if removed else None"
    )

    def clean() -> None:
        try:
            subprocess.run([sys.executable, "-c", code], timeout=300, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("orphaned host state cleanup failed: %s", exc)

    threading.Thread(target=clean, name="slidedp-shm-cleanup", daemon=True).start()


IDLE_EXIT_S = 15.0  # what a clean Celery shutdown needs once no job runs


def bound_shutdown(settings) -> None:
    """Once asked to stop, exit within a bounded time even if Celery's own shutdown hangs (it retries a broker
    that is gone forever, e.g. when Redis was stopped at the same moment): a running job gets the cancel grace
    period to stop at a step boundary and save, then the process has IDLE_EXIT_S to finish cleanly."""
    from celery.signals import worker_shutting_down

    from slidedp_web import tasks

    def watch() -> None:
        deadline = time.monotonic() + settings.cancel_grace_s + 30
        while tasks.supervising.is_set() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(IDLE_EXIT_S)
        log.warning(
            "the worker did not finish shutting down within %.0f s of its last job: exiting", IDLE_EXIT_S
        )
        logging.shutdown()
        os._exit(0)

    @worker_shutting_down.connect(weak=False)
    def _start(**_: object) -> None:
        threading.Thread(target=watch, name="slidedp-shutdown-bound", daemon=True).start()


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.name:
        os.environ["SLIDEDP_HOST_NAME"] = args.name
    if args.queue:
        os.environ["SLIDEDP_WORKER_QUEUE"] = args.queue
    from slidedp_web import logs
    from slidedp_web.core.config import get_settings

    get_settings.cache_clear()
    settings = get_settings()
    logs.configure(args.loglevel, settings.log_format)
    if logs.json_enabled():
        from celery.signals import setup_logging

        # A receiver of setup_logging tells Celery to leave logging as configured here (JSON records).
        setup_logging.connect(lambda **_: None, weak=False)
    from slidedp_web import hosts
    from slidedp_web.celery_app import get_celery

    try:
        prepare(settings)
    except Exception as exc:  # noqa: BLE001 - say what to fix instead of a traceback
        url = settings.sqlalchemy_url.split("@")[-1]
        print(
            f"slidedp worker: cannot prepare the database at {url}: {type(exc).__name__}: {exc}\n"
            "Check DATABASE_URL (and that the database server is up), then start the worker again.",
            file=sys.stderr,
        )
        return 1
    reporter = hosts.Reporter(settings)
    reporter.start()
    app = get_celery(settings)
    import slidedp_web.tasks  # noqa: F401 - registers the task on the app

    bound_shutdown(settings)

    log.info(
        "worker %s consuming queue %s (broker %s)", settings.host_name, settings.queue, settings.redis_url
    )
    try:
        app.worker_main(
            # --quiet: no start-up banner, which Celery prints as plain text, between JSON records.
            (["--quiet"] if logs.json_enabled() else [])
            + [
                "worker",
                "--pool=threads",
                "--concurrency=1",
                "--queues",
                settings.queue,
                "--hostname",
                f"slidedp@{settings.host_name}",
                "--loglevel",
                args.loglevel,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
    finally:
        reporter.stopped.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
