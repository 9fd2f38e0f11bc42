"""A saved host: one GPU host's topology and calibrations in one JSON file, to plan for that host from elsewhere.

    slidedp topology --save h200x2.json          # on the GPU host: its topology and cached calibrations
    slidedp plan --config job.yaml --host h200x2.json    # on a laptop: the plan for that host

The workbench's Hosts page imports the same file (POST /api/hosts/import). The format is docs/interfaces.md §4
("Saved host"). Imports no torch: the API validates imported files with it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from slidedp import atomic_file
from slidedp.planning.shape import calibration_shape, shape_differences

KIND = "slidedp-host"
FILE_SCHEMA = 1
# A calibration record is 2-10 KiB: a host with a hundred measured shapes still fits. As the API's default request
# bound (SLIDEDP_MAX_REQUEST_BYTES), so a file the CLI reads imports too.
MAX_BYTES = 2**20


class HostFileError(ValueError):
    """A file that is not a saved host, with what is wrong and how to make one."""


@dataclass
class SavedHost:
    name: str
    saved_at: str
    topology: dict[str, Any]
    calibrations: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "schema": FILE_SCHEMA, "name": self.name, "saved_at": self.saved_at,
                "topology": self.topology, "calibrations": self.calibrations}


def build(topology: dict[str, Any], calibrations: list[dict[str, Any]]) -> SavedHost:
    return SavedHost(
        name=str(topology.get("hostname") or "host"),
        saved_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        topology=topology,
        calibrations=calibrations,
    )


def save(path: str, host: SavedHost) -> None:
    atomic_file.write_json(path, host.to_dict())


def load(path: str) -> SavedHost:
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise HostFileError(f"{path} is {size} bytes, more than a saved host's {MAX_BYTES}")
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise HostFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise HostFileError(f"{path} is not JSON ({exc}); {_MAKE}") from None
    return parse(data)


_MAKE = "make one on the host with `slidedp topology --save FILE`"


def parse(data: Any) -> SavedHost:
    """The saved host in `data` (a parsed JSON document), or HostFileError saying the first thing wrong."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise HostFileError(f"not a saved host: it needs \"kind\": \"{KIND}\"; {_MAKE}")
    if data.get("schema") != FILE_SCHEMA:
        raise HostFileError(f"saved-host schema {data.get('schema')!r} is not {FILE_SCHEMA}, the one this version "
                            f"reads; save it again with this version's `slidedp topology --save FILE`")
    name, saved_at = data.get("name"), data.get("saved_at")
    if not isinstance(name, str) or not name.strip() or len(name) > 120:
        raise HostFileError("\"name\" must be the host's name, 1 to 120 characters")
    if not isinstance(saved_at, str) or not saved_at:
        raise HostFileError("\"saved_at\" must be the ISO time the file was saved")
    topo = data.get("topology")
    if not isinstance(topo, dict) or not isinstance(topo.get("gpus"), list) or not isinstance(topo.get("cpu"), dict):
        raise HostFileError("\"topology\" must be `slidedp topology`'s JSON (docs/interfaces.md §4) with its "
                            "\"gpus\" list and \"cpu\" object")
    for i, g in enumerate(topo["gpus"]):
        if not isinstance(g, dict) or not isinstance(g.get("hbm_bytes"), int):
            raise HostFileError(f"topology.gpus[{i}] must be an object with an integer \"hbm_bytes\"")
    if not isinstance(topo.get("links", []), list):
        raise HostFileError("topology.links must be a list")
    cals = data.get("calibrations")
    if not isinstance(cals, list):
        raise HostFileError("\"calibrations\" must be a list of calibration records (docs/interfaces.md §5), "
                            "empty when the host has measured none")
    for i, c in enumerate(cals):
        if not isinstance(c, dict) or not isinstance(c.get("shape"), dict) or c.get("device") not in ("cuda", "cpu"):
            raise HostFileError(f"calibrations[{i}] is not a calibration record: it needs a \"shape\" object and "
                                "\"device\" cuda or cpu")
    return SavedHost(name=name.strip(), saved_at=saved_at, topology=topo, calibrations=cals)


def pick_calibration(cfg: Any, host: SavedHost) -> dict[str, Any] | None:
    """The host's calibration measured at this job's shape, world size and device (and with GPU peer-to-peer as
    the host has it): full before quick, then the newest; None when there is none and the plan fits memory only.
    The match is by shape and not by the cache key, which also holds this machine's torch version."""
    from slidedp.planning.shape import upgrade_calibration
    from slidedp.presets import model_config_dict

    wanted = calibration_shape(cfg, model_config_dict(cfg.model))
    device = "cuda" if cfg.gpus > 0 else "cpu"
    p2p_off = bool(host.topology.get("p2p_disabled"))
    matches = []
    for record in map(upgrade_calibration, host.calibrations):
        if record.get("outdated") or shape_differences(wanted, record.get("shape") or {}):
            continue
        if record.get("world") != cfg.world_size or record.get("device") != device:
            continue
        if device == "cuda" and bool(record.get("p2p_disabled")) != p2p_off:
            continue
        matches.append(record)
    if not matches:
        return None
    return max(matches, key=lambda r: (not r.get("quick"), str(r.get("created_at", ""))))


def describe(host: SavedHost, path: str) -> str:
    """The line a plan for a saved host opens with."""
    return f"planned for the imported host {host.name} from {path}, saved {host.saved_at[:10]}"
