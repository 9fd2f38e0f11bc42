"""Which machine a calibration record was measured on, so that no record made on other hardware passes for this
host's: a cache folder copied from another machine, or shared by containers that all call themselves one name.

    record["host_digest"] = host_digest(topology)       # calibration.py writes it in every record's header
    measured_on(record, topology)                        # False: the record is neither used nor listed here

Imports no torch: the workbench's API and worker filter the records they list with it.
"""

from __future__ import annotations

import hashlib
import json
import socket
from typing import Any


def host_identity(topology: dict[str, Any]) -> dict[str, Any]:
    """What names this machine's hardware in a topology (docs/interfaces.md §4): its hostname, the CPU's model and
    cores, and each GPU's name, memory and UUID. Left out is what one machine reports differently from day to day
    or job to job: the RAM limit (a job or the workbench may set one), free shared memory, software versions."""
    cpu = topology.get("cpu") if isinstance(topology.get("cpu"), dict) else {}
    gpus = sorted(
        (
            [str(g.get("name")), int(g.get("hbm_bytes") or 0), str(g.get("uuid") or "")]
            for g in topology.get("gpus") or []
            if isinstance(g, dict)
        ),
    )
    return {
        "hostname": topology.get("hostname") or socket.gethostname(),
        "cpu": [cpu.get("model"), cpu.get("cores"), cpu.get("logical_cpus")],
        "gpus": gpus,
    }


def host_digest(topology: dict[str, Any]) -> str:
    """host_identity as 16 hex digits (sha256 of its canonical JSON)."""
    text = json.dumps(host_identity(topology), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measured_on(record: dict[str, Any], topology: dict[str, Any]) -> bool:
    """Whether a calibration record was measured on the host this topology describes.

    A record written before records carried host_digest is judged by what its header names: its host must be
    this hostname and its GPU (gpu_name) one of this host's GPUs."""
    digest = record.get("host_digest")
    if digest:
        return digest == host_digest(topology)
    if record.get("host") != (topology.get("hostname") or socket.gethostname()):
        return False
    gpu = record.get("gpu_name")
    return gpu is None or gpu in {g.get("name") for g in topology.get("gpus") or [] if isinstance(g, dict)}
