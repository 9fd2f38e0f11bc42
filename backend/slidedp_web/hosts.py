"""Worker hosts: what each GPU host reports about itself (topology, calibration) and when it last did.

A worker reports when it starts and every SLIDEDP_HOST_REPORT_S; the API plans and validates jobs for a host
from its report (its GPUs, its host RAM, its calibration) without running anything on it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from datetime import timedelta
from typing import Any, Optional

import sqlalchemy as sa
from sqlmodel import Session, select

from slidedp_web.core.config import Settings
from slidedp_web.core.db import write_session
from slidedp_web.journal import clean_json
from slidedp_web.models import Host, as_utc, utcnow

log = logging.getLogger(__name__)


def local_topology(settings: Settings) -> dict[str, Any]:
    """This machine's topology from slidedp's detector (torch-free), or the basics when it is not there."""
    try:
        from slidedp.planning.topology import detect
    except ImportError:
        detect = None
    if detect is not None:
        try:
            return clean_json(detect(host_ram_gib=settings.host_ram_gib))
        except Exception as exc:  # noqa: BLE001 - a broken probe must not keep the worker from serving
            log.warning("topology detection failed (%s); reporting the basics", exc)
    return basic_topology(settings)


def basic_topology(settings: Settings) -> dict[str, Any]:
    import psutil

    ram = int(settings.host_ram_gib * 2**30) if settings.host_ram_gib else _cgroup_or_total_ram(psutil)
    return {
        "source": "slidedp_web basic probe (slidedp.planning.topology unavailable)",
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "host_ram_bytes": ram,
        "gpus": [],
    }


def _cgroup_or_total_ram(psutil: Any) -> int:
    total = int(psutil.virtual_memory().total)
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            return int(text)
    return total


def local_calibration(settings: Settings) -> Optional[dict[str, Any]]:
    path = settings.calibration_path
    if not path.is_file():
        return None
    try:
        return clean_json(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        log.warning("calibration file %s unreadable: %s", path, exc)
        return None


def report(settings: Settings, *, topology: Optional[dict] = None, started: bool = False) -> None:
    """Upsert this host's row: queue, topology, calibration, last_seen."""
    now = utcnow()
    values: dict[str, Any] = {"queue": settings.queue, "last_seen": now,
                              "calibration": local_calibration(settings)}
    if topology is not None:
        values["topology"] = topology
    if started:
        values.update(started_at=now, current_job_id=None)
    for _ in range(2):
        try:
            with write_session(settings) as session:
                done = session.execute(sa.update(Host).where(Host.name == settings.host_name).values(values))
                if done.rowcount == 0:
                    session.add(Host(name=settings.host_name, **{"topology": {}, **values}))
            return
        except sa.exc.IntegrityError:
            continue  # another process inserted the row first: update it


def set_current_job(session: Session, host_name: str, job_id: Optional[int]) -> None:
    session.execute(sa.update(Host).where(Host.name == host_name).values(current_job_id=job_id))


def online_window_s(settings: Settings) -> float:
    return 2.5 * settings.host_report_s + 5.0


def is_online(settings: Settings, host: Host) -> bool:
    seen = as_utc(host.last_seen)
    return seen is not None and utcnow() - seen <= timedelta(seconds=online_window_s(settings))


def online_hosts(session: Session, settings: Settings) -> list[Host]:
    return [h for h in session.exec(select(Host).order_by(Host.name)).all() if is_online(settings, h)]


class Reporter(threading.Thread):
    """Reports this host every SLIDEDP_HOST_REPORT_S until stopped (a daemon thread of the worker)."""

    def __init__(self, settings: Settings):
        super().__init__(name="slidedp-host-report", daemon=True)
        self.settings = settings
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.settings.host_report_s):
            try:
                report(self.settings, topology=local_topology(self.settings))
            except Exception as exc:  # noqa: BLE001 - keep reporting through a database hiccup
                log.warning("host report failed: %s", exc)
