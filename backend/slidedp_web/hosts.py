"""Worker hosts: what each GPU host reports about itself (topology, calibration) and when it last did.

A worker reports when it starts and every SLIDEDP_HOST_REPORT_S; the API plans and validates jobs for a host
from its report (its GPUs, its host RAM, its calibration) without running anything on it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Optional

import sqlalchemy as sa
from sqlmodel import Session, select

from slidedp_web.core.config import Settings
from slidedp_web.core.db import write_session
from slidedp_web.journal import clean_json
from slidedp_web.models import Host, as_utc, utcnow

log = logging.getLogger(__name__)
TOPOLOGY_EVERY_S = 600.0  # GPUs and links rarely change; last_seen and calibration go out every report


def local_topology(settings: Settings) -> dict[str, Any]:
    """This machine's topology from slidedp's detector, or the basics when it is not there.

    The detector asks torch for its CUDA and NCCL versions, so it runs in a child process: neither the API
    nor the worker's own process imports torch (the worker spawns each job's process fresh).
    """
    code = (
        "import json, sys\n"
        "from slidedp.planning.topology import detect\n"
        "ram = float(sys.argv[1]) if len(sys.argv) > 1 else None\n"
        "print(json.dumps(detect(host_ram_gib=ram)))\n"
    )
    argv = [sys.executable, "-c", code] + ([str(settings.host_ram_gib)] if settings.host_ram_gib else [])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode == 0:
            return clean_json(json.loads(out.stdout.strip().splitlines()[-1]))
        log.warning("topology detection failed (%s); reporting the basics", out.stderr.strip()[-500:])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        log.warning("topology detection failed (%s); reporting the basics", exc)
    return basic_topology(settings)


def host_ram_bytes(topology: Optional[dict[str, Any]]) -> Optional[int]:
    """The host RAM a job may use, from a topology report (§4: host_ram.limit_bytes)."""
    if not topology:
        return None
    value = topology.get("host_ram_bytes")
    if value is None and isinstance(topology.get("host_ram"), dict):
        value = topology["host_ram"].get("limit_bytes")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def basic_topology(settings: Settings) -> dict[str, Any]:
    """What the API knows of its own machine without the detector (no GPUs listed): CPU count and host RAM."""
    from slidedp.host_memory import host_ram_limit

    limit, source = host_ram_limit(settings.host_ram_gib)
    return {
        "schema": 1,
        "source": "slidedp_web basic probe (no worker has reported this host's topology)",
        "hostname": socket.gethostname(),
        "gpus": [],
        "links": [],
        "cpu": {"logical_cores": os.cpu_count()},
        "host_ram": {"limit_bytes": limit, "source": source},
    }


def local_calibration(
    settings: Settings, hostname: Optional[str] = None, topology: Optional[dict[str, Any]] = None
) -> Optional[dict[str, Any]]:
    """This host's cached calibrations ({"dir", "entries": [calibration JSON, ...]}, §5), None without any.

    The runtime caches one calibration per host and job shape (`slidedp plan`, or a job's own planning) in this
    workbench's calibration folder; the API picks the entry that matches a job's shape when it previews the job's
    plan. A record measured on other hardware (slidedp.planning.host_identity: its host_digest, else the host
    and GPU its header names, against `topology`, or this hostname without one) is left out.
    """
    from slidedp.planning.host_identity import measured_on

    directory = settings.calibration_path
    if not directory.is_dir():
        return None
    here = topology or {"hostname": hostname or socket.gethostname()}
    prefix = f"{here.get('hostname') or socket.gethostname()}-"
    entries = []
    for path in sorted(directory.glob(f"{prefix}*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("calibration file %s unreadable: %s", path, exc)
            continue
        if not isinstance(record, dict):
            continue
        if topology is not None and not measured_on(record, topology):
            log.info("calibration file %s was measured on other hardware: not this host's", path)
        elif topology is None and record.get("host") != here["hostname"]:
            log.info("calibration file %s names host %s: not this host's", path, record.get("host"))
        else:
            entries.append(clean_json(record))
    return {"dir": str(directory), "entries": entries} if entries else None


def report(settings: Settings, *, topology: Optional[dict] = None, started: bool = False) -> None:
    """Upsert this host's row: queue, topology, calibration, last_seen."""
    now = utcnow()
    values: dict[str, Any] = {"queue": settings.queue, "last_seen": now}
    if topology is not None:
        values["topology"] = topology
    if started:
        values.update(started_at=now, current_job_id=None)
    for _ in range(2):
        try:
            with write_session(settings) as session:
                # the records are judged against the topology this host last reported (detected every
                # TOPOLOGY_EVERY_S, not at each report)
                known = topology or session.execute(
                    sa.select(Host.topology).where(Host.name == settings.host_name)
                ).scalar()
                values["calibration"] = local_calibration(settings, topology=known or None)
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
    """Reports this host every SLIDEDP_HOST_REPORT_S until stopped (a daemon thread of the worker); the
    topology is detected again every TOPOLOGY_EVERY_S."""

    def __init__(self, settings: Settings):
        super().__init__(name="slidedp-host-report", daemon=True)
        self.settings = settings
        self.stopped = threading.Event()

    def run(self) -> None:
        last_topology = time.monotonic()
        while not self.stopped.wait(self.settings.host_report_s):
            try:
                topology = None
                if time.monotonic() - last_topology > TOPOLOGY_EVERY_S:
                    topology, last_topology = local_topology(self.settings), time.monotonic()
                report(self.settings, topology=topology)
            except Exception as exc:  # noqa: BLE001 - keep reporting through a database hiccup
                log.warning("host report failed: %s", exc)


# ---------------------------------------------------------------------------- imported hosts
# A host imported from a saved-host file (`slidedp topology --save`, docs/interfaces.md §4 "Saved host") has a row
# like a worker's so that POST /api/plan can plan for it, but no worker ever consumes its queue: it never reports
# (never online, so never chosen for a job without a host) and POST /api/jobs refuses it by name.
IMPORTED_PREFIX = "imported:"
IMPORTED_QUEUE = "none (imported host)"


def imported_marker(host: Any) -> Optional[dict[str, Any]]:
    """{"name", "file", "saved_at", "imported_at"} of an imported host, None for a worker's host."""
    topology = getattr(host, "topology", None)
    marker = topology.get("imported") if isinstance(topology, dict) else None
    return marker if isinstance(marker, dict) else None


def import_saved(settings: Settings, saved: Any, file_name: str) -> str:
    """Store a saved host (slidedp.planning.host_file.SavedHost) as host `imported:<name>`, replacing an earlier
    import of the same name; its name."""
    name = IMPORTED_PREFIX + saved.name
    marker = {"name": saved.name, "file": file_name, "saved_at": saved.saved_at, "imported_at": utcnow().isoformat()}
    values = {
        "queue": IMPORTED_QUEUE,
        "topology": clean_json({**saved.topology, "imported": marker}),
        "calibration": {"dir": None, "entries": clean_json(saved.calibrations)} if saved.calibrations else None,
        "last_seen": None,
        "current_job_id": None,
    }
    with write_session(settings) as session:
        existing = session.get(Host, name)
        if existing is not None and imported_marker(existing) is None:
            raise ValueError(f"a worker host is named {name!r}; rename the saved host's \"name\" to import it")
        if existing is None:
            session.add(Host(name=name, **values))
        else:
            session.execute(sa.update(Host).where(Host.name == name).values(values))
    return name


def imported_host_error(host: Any) -> Optional[dict[str, str]]:
    """{"loc": "host", "msg"} when a job names an imported host, which has no worker to run it."""
    marker = imported_marker(host)
    if marker is None:
        return None
    return {"loc": "host", "msg": f"{host.name} is an imported host (from {marker.get('file')}): the workbench can "
            "plan for it but has no worker there to run jobs; start a worker on that machine (slidedp worker) and "
            "submit to the host it reports as"}
