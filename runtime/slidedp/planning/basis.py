"""A plan's basis: what a plan was made on (the host's topology facts and the calibration it was priced with), as
digests a later run compares to tell whether a stored plan still holds, and why not when it does not.

    basis = plan_basis(cfg, topology, calibration)     # plan_job stores it in plan["basis"]
    basis_change(plan["basis"], basis)                 # None: the stored plan is the one this run would make

Imports no torch. slidedp.planning.autopolicy re-exports plan_basis and basis_change.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from slidedp.planning.job import GIB

# The part of a topology each digest in basis["topology_parts"] covers, as a re-plan names it.
TOPOLOGY_PARTS = {"gpus": "GPUs", "links": "GPU links", "cpu_cores": "CPU cores", "host_ram_limit_bytes": "RAM limit"}


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def topology_facts(cfg: Any, topology: dict[str, Any] | None) -> dict[str, Any]:
    """What a plan takes from a host's topology (docs/interfaces.md §4), and nothing that changes between two
    reports of one unchanged host: each GPU's name and memory, the links between GPUs (kind, P2P), the usable CPU
    cores, and the host RAM limit the job plans against (its own host_ram_gib where it sets one, as the planner
    takes it). Left out: hostname, timestamps, free shared memory, PCIe link speeds (a GPU lowers them when idle),
    software versions, NUMA placement and the limit's source."""
    topology = topology or {}
    gpus = [
        {"name": g.get("name"), "hbm_bytes": g.get("hbm_bytes")}
        for g in topology.get("gpus") or []
        if isinstance(g, dict)
    ]
    links = sorted(
        (
            {"a": lk.get("a"), "b": lk.get("b"), "kind": lk.get("kind"), "p2p": bool(lk.get("p2p"))}
            for lk in topology.get("links") or []
            if isinstance(lk, dict)
        ),
        key=lambda lk: (str(lk["a"]), str(lk["b"])),
    )
    cpu = topology.get("cpu") if isinstance(topology.get("cpu"), dict) else {}
    if getattr(cfg, "host_ram_gib", None) is not None:
        ram = int(cfg.host_ram_gib * GIB)  # as Job.from_config takes it: the host's own figure does not count
    else:
        host_ram = topology.get("host_ram") if isinstance(topology.get("host_ram"), dict) else {}
        ram = int(host_ram.get("limit_bytes") or 0)
    return {"gpus": gpus, "links": links, "cpu_cores": cpu.get("cores"), "host_ram_limit_bytes": ram}


def calibration_identity(calibration: dict[str, Any] | None) -> Any:
    """Which calibration a plan was priced with: its header (when it was measured, for which shape, world and
    device, under which cache key), or its whole content when it has no header; None without one. What runs
    observed on it since (planning/observed.py) prices nothing, so it is not part of it."""
    if not calibration:
        return None
    if calibration.get("created_at"):
        return {k: calibration.get(k) for k in ("key", "created_at", "shape", "world", "device", "quick")}
    return {k: v for k, v in calibration.items() if k != "observed_host"}


def calibration_digest(calibration: dict[str, Any] | None) -> str | None:
    """plan_basis's "calibration" entry for `calibration`."""
    ident = calibration_identity(calibration)
    return None if ident is None else _digest(ident)


def plan_basis(cfg: Any, topology: dict[str, Any] | None, calibration: dict[str, Any] | None) -> dict[str, Any]:
    """{"topology": digest, "calibration": digest or None, "topology_parts": {part: digest}}: sha256 (first 16 hex
    digits) of the canonical JSON of topology_facts and calibration_identity. Two reports of one unchanged host
    give the same basis; a plan whose basis equals the one a run computes is the plan that run would make."""
    facts = topology_facts(cfg, topology)
    return {
        "topology": _digest(facts),
        "calibration": calibration_digest(calibration),
        "topology_parts": {k: _digest(facts[k]) for k in TOPOLOGY_PARTS},
    }


def basis_change(stored: Any, current: dict[str, Any]) -> str | None:
    """Why a plan made on basis `stored` does not hold on basis `current` (both plan_basis's), None when it does."""
    if not isinstance(stored, dict) or "topology" not in stored or "calibration" not in stored:
        return "the stored plan has no basis"
    why = []
    if stored["topology"] != current["topology"]:
        before, now = stored.get("topology_parts") or {}, current.get("topology_parts") or {}
        changed = [name for key, name in TOPOLOGY_PARTS.items() if key in before and before[key] != now.get(key)]
        what = f"the host's {_and(changed)}" if changed else "the host"
        why.append(f"{what} changed since the job was planned")
    if stored["calibration"] != current["calibration"]:
        if stored["calibration"] is None:
            why.append("a calibration for this shape exists now")
        elif current["calibration"] is None:
            why.append("the job was planned with a calibration this run does not use")
        else:
            why.append("the calibration for this shape changed since the job was planned")
    return "; ".join(why) or None


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
