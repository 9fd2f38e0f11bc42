"""Topology: what this host is made of — GPUs and their HBM, the links between GPUs (NVLink or PCIe, P2P),
each GPU's PCIe link, CPU cores, NUMA nodes, the host RAM the job may use, shared memory and software.

    python -m slidedp.planning.topology            # prints the JSON (the CLI `slidedp topology` does the same)

Plain JSON-serialisable data; works with no GPU. GPU facts come from `nvidia-smi` and /sys, never from
CUDA in this process: the worker that calls this spawns the training ranks afterwards, and a CUDA context in
the parent would break them (CUDA and fork do not mix). Only when nvidia-smi is missing is torch asked, in
a child process. The schema is docs/interfaces.md §4.

Host RAM is taken from a configured figure, else a real cgroup limit, else MemTotal: on the GPU machine
MemTotal starts small and grows as memory is touched, so it is the weakest of the three.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SCHEMA_VERSION = 1
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# PCIe transfer rate per lane (GT/s) -> generation, as /sys reports it ("32.0 GT/s PCIe").
_GTS_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def detect(host_ram_gib: float | None = None) -> dict[str, Any]:
    """The topology of this host as plain data (docs/interfaces.md §4).

    ``host_ram_gib``: a configured host-RAM figure for the job; it wins over the cgroup limit and MemTotal.
    """
    p2p_disabled = os.environ.get("NCCL_P2P_DISABLE", "").strip() not in ("", "0")
    gpus, raw_links, source = _gpus_and_links()
    links = [_link(a, b, detail, p2p, p2p_disabled) for (a, b), (detail, p2p) in sorted(raw_links.items())]
    notes = []
    if p2p_disabled and len(gpus) > 1:
        notes.append(
            "NCCL_P2P_DISABLE=1: GPUs do not exchange data directly; collectives cross host memory over PCIe "
            "(links report kind 'pcie-host', p2p false; 'hardware' keeps what the GPUs are wired with)."
        )
    limit, ram_source, memtotal = host_ram_limit_bytes(host_ram_gib)
    return {
        "schema": SCHEMA_VERSION,
        "hostname": socket.gethostname(),
        "gpus": gpus,
        "gpu_source": source,
        "links": links,
        "p2p_disabled": p2p_disabled,
        "cpu": _cpu(),
        "host_ram": {"limit_bytes": limit, "source": ram_source, "memtotal_bytes": memtotal},
        "shm": _shm(),
        "software": _software(),
        "notes": notes,
    }


# ---------------------------------------------------------------------------- GPUs and links
def _run(cmd: list[str], timeout: float = 20.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _gpus_and_links() -> tuple[list[dict], dict[tuple[int, int], tuple[str, bool | None]], str]:
    """GPUs visible to this process and the link between each pair, as (detail, p2p-capable)."""
    if shutil.which("nvidia-smi") is None:
        return _gpus_from_torch_child()
    # The three calls are independent; each can take a second where the driver is not kept loaded: run them at once.
    with ThreadPoolExecutor(3, thread_name_prefix="slidedp-smi") as pool:
        calls = [
            pool.submit(_run, cmd)
            for cmd in (
                ["nvidia-smi", "--query-gpu=" + ",".join(_GPU_FIELDS), "--format=csv,noheader,nounits"],
                ["nvidia-smi", "topo", "-m"],
                ["nvidia-smi", "topo", "-p2p", "r"],
            )
        ]
        query, topo_m, topo_p2p = (c.result() for c in calls)
    if query is None:  # older drivers lack some pcie.* fields
        query = _run(["nvidia-smi", "--query-gpu=" + ",".join(_GPU_FIELDS[:5]), "--format=csv,noheader,nounits"])
    if query is None:
        return _gpus_from_torch_child()
    physical = parse_gpu_query(query)
    visible = _visible(physical, os.environ.get("CUDA_VISIBLE_DEVICES"))
    matrix = parse_topo_matrix(topo_m or "")
    p2p = parse_topo_matrix(topo_p2p or "")
    gpus, links = [], {}
    for idx, g in enumerate(visible):
        pcie = sysfs_pcie(g["bus_id"]) or {}
        gpus.append(
            {
                "index": idx,
                "physical_index": g["index"],
                "uuid": g["uuid"],
                "name": g["name"],
                "hbm_bytes": g["hbm_bytes"],
                "bus_id": g["bus_id"],
                "pcie": {
                    "gen": pcie.get("gen", g["gen"]),
                    "width": pcie.get("width", g["width"]),
                    "max_gen": pcie.get("max_gen", g["max_gen"]),
                    "max_width": pcie.get("max_width", g["max_width"]),
                    "source": "sysfs" if pcie else "nvidia-smi",
                },
                "numa_node": pcie.get("numa_node", matrix.get("numa", {}).get(g["index"])),
            }
        )
    for a, ga in enumerate(visible):
        for b, gb in enumerate(visible):
            if a < b:
                detail = matrix.get("pairs", {}).get((ga["index"], gb["index"]), "")
                cap = p2p.get("pairs", {}).get((ga["index"], gb["index"]))
                links[(a, b)] = (detail, None if cap is None else cap == "OK")
    return gpus, links, "nvidia-smi"


_GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "pci.bus_id",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)
_GPU_KEYS = ("index", "uuid", "name", "hbm_bytes", "bus_id", "gen", "max_gen", "width", "max_width")


def parse_gpu_query(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=<_GPU_FIELDS or its first five> --format=csv,noheader,nounits`."""
    rows = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5 or not cells[0].isdigit():
            continue
        row: dict[str, Any] = dict.fromkeys(_GPU_KEYS)
        for key, cell in zip(_GPU_KEYS, cells):
            row[key] = cell
        row["index"] = int(row["index"])
        row["hbm_bytes"] = int(float(row["hbm_bytes"]) * 2**20)  # MiB
        for key in ("gen", "max_gen", "width", "max_width"):
            row[key] = int(row[key]) if row[key] and row[key].isdigit() else None
        rows.append(row)
    return rows


def _visible(gpus: list[dict], cvd: str | None) -> list[dict]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves to this process, in the order CUDA numbers them."""
    if cvd is None:
        return gpus
    chosen = []
    for tok in [t.strip() for t in cvd.split(",") if t.strip()]:
        match = [g for g in gpus if (tok.isdigit() and g["index"] == int(tok)) or g["uuid"].startswith(tok)]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen.append(match[0])
    return chosen


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """Parse `nvidia-smi topo -m` (or `topo -p2p r`): {"pairs": {(i, j): "NV18"|"PHB"|"OK"...}, "numa": {i: node}}."""
    lines = [_ANSI.sub("", ln).rstrip("\n") for ln in text.splitlines()]
    header = next((ln for ln in lines if re.search(r"\tGPU\d+", "\t" + ln.strip())), None)
    if header is None:
        return {"pairs": {}, "numa": {}}
    cols = [c.strip() for c in header.strip().split("\t")]
    pairs: dict[tuple[int, int], str] = {}
    numa: dict[int, int] = {}
    for ln in lines:
        cells = [c.strip() for c in ln.split("\t")]
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        i = int(cells[0][3:])
        for col, val in zip(cols, cells[1:]):
            if re.fullmatch(r"GPU\d+", col) and int(col[3:]) != i:
                pairs[(i, int(col[3:]))] = val
            elif col == "NUMA Affinity" and val.isdigit():
                numa[i] = int(val)
    return {"pairs": pairs, "numa": numa}


def _link(a: int, b: int, detail: str, p2p: bool | None, p2p_disabled: bool) -> dict[str, Any]:
    hardware = "nvlink" if detail.startswith("NV") else ("pcie" if detail else "none")
    if p2p is None:
        p2p = hardware == "nvlink"  # NVLink pairs are P2P-capable; PCIe pairs unknown -> assume not
    kind = hardware
    if p2p_disabled:
        kind, p2p = "pcie-host", False
    return {"a": a, "b": b, "kind": kind, "p2p": bool(p2p), "detail": detail, "hardware": hardware}


def _gpus_from_torch_child() -> tuple[list[dict], dict, str]:
    """Without nvidia-smi: ask torch in a child process (keeps CUDA out of this one). No GPU -> empty."""
    script = (
        "import json, torch\n"
        "if not torch.cuda.is_available():\n    print('[]'); raise SystemExit\n"
        "n = torch.cuda.device_count(); out = []\n"
        "for i in range(n):\n"
        "    p = torch.cuda.get_device_properties(i)\n"
        "    peers = [j for j in range(n) if j != i and torch.cuda.can_device_access_peer(i, j)]\n"
        "    out.append({'name': p.name, 'hbm_bytes': p.total_memory, 'peers': peers})\n"
        "print(json.dumps(out))\n"
    )
    try:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            return [], {}, "none"
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return [], {}, "none"
    gpus = [
        {
            "index": i,
            "physical_index": i,
            "uuid": None,
            "name": g["name"],
            "hbm_bytes": int(g["hbm_bytes"]),
            "bus_id": None,
            "pcie": {"gen": None, "width": None, "max_gen": None, "max_width": None, "source": "unknown"},
            "numa_node": None,
        }
        for i, g in enumerate(found)
    ]
    links = {
        (a, b): ("", b in found[a]["peers"]) for a in range(len(found)) for b in range(a + 1, len(found))
    }
    return gpus, links, "torch" if gpus else "none"


def sysfs_pcie(bus_id: str | None, root: str = "/sys") -> dict[str, Any] | None:
    """PCIe link (gen, width, max) and NUMA node of a device from /sys/bus/pci/devices/<bdf>."""
    if not bus_id:
        return None
    # nvidia-smi prints an 8-digit domain ("00000000:19:00.0"); sysfs uses 4 digits, lower case.
    dom, _, rest = bus_id.lower().partition(":")
    path = os.path.join(root, "bus/pci/devices", f"{dom[-4:]}:{rest}")
    if not os.path.isdir(path):
        return None

    def read(name: str) -> str | None:
        try:
            with open(os.path.join(path, name), encoding="ascii") as fh:
                return fh.read().strip()
        except OSError:
            return None

    def gen(speed: str | None) -> int | None:
        m = re.match(r"([\d.]+)\s*GT/s", speed or "")
        return _GTS_TO_GEN.get(float(m.group(1))) if m else None

    def width(w: str | None) -> int | None:
        return int(w) if w and w.isdigit() else None

    numa = read("numa_node")
    return {
        "gen": gen(read("current_link_speed")),
        "width": width(read("current_link_width")),
        "max_gen": gen(read("max_link_speed")),
        "max_width": width(read("max_link_width")),
        "numa_node": int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
    }


# ---------------------------------------------------------------------------- host
def host_ram_limit_bytes(configured_gib: float | None = None, root: str = "/") -> tuple[int, str, int]:
    """(limit_bytes, source, memtotal_bytes): a configured figure, else a real cgroup limit, else MemTotal.

    The cgroup reader is the one job validation uses (slidedp.validation), so both agree on the figure.
    """
    from slidedp.host_memory import cgroup_memory_limit

    memtotal = _meminfo(os.path.join(root, "proc/meminfo")).get("MemTotal", 0)
    if configured_gib is not None:
        return int(configured_gib * 2**30), "configured", memtotal
    cg = cgroup_memory_limit(os.path.join(root, "sys/fs/cgroup"), os.path.join(root, "proc/self/cgroup"))
    if cg is not None:
        return cg, "cgroup", memtotal
    return memtotal, "meminfo", memtotal


def _meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    out = {}
    try:
        with open(path, encoding="ascii") as fh:
            for ln in fh:
                key, _, rest = ln.partition(":")
                fields = rest.split()
                if fields and fields[0].isdigit():
                    out[key] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1] == "kB" else 1)
    except OSError:
        pass
    return out


def _cpu() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for ln in fh:
                if ln.startswith("model name"):
                    model = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cores": usable,
        "logical_cpus": os.cpu_count(),
        "quota_cores": _cpu_quota(),
        "model": model,
        "numa_nodes": _numa_nodes(),
    }


def _cpu_quota() -> float | None:
    """cgroup CPU quota in cores (v2 cpu.max "quota period", v1 cfs files); None when unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as fh:
            quota, period = fh.read().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as fh:
            quota = int(fh.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as fh:
            period = int(fh.read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _numa_nodes() -> int:
    try:
        with open("/sys/devices/system/node/online", encoding="ascii") as fh:
            text = fh.read().strip()
    except OSError:
        return 1
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += (int(hi) - int(lo) + 1) if hi else 1
    return max(count, 1)


def _shm(path: str = "/dev/shm") -> dict[str, Any]:
    try:
        st = os.statvfs(path)
    except OSError:
        return {"path": path, "free_bytes": None, "total_bytes": None}
    return {"path": path, "free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}


def _software() -> dict[str, Any]:
    """Versions; importing torch does not initialise CUDA (the NCCL version is a library call)."""
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": None,
        "cuda": None,
        "nccl": None,
        "transformers": None,
    }
    try:
        from importlib.metadata import PackageNotFoundError, version

        for pkg in ("torch", "transformers"):
            try:
                out[pkg] = version(pkg)
            except PackageNotFoundError:
                pass
    except ImportError:
        pass
    if out["torch"] is not None:
        try:
            import torch

            out["cuda"] = torch.version.cuda
            if torch.version.cuda is not None:
                nccl = torch.cuda.nccl.version()
                out["nccl"] = ".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl)
        except Exception:  # a broken CUDA install must not break topology
            pass
    return out


# ---------------------------------------------------------------------------- summaries the planner uses
def job_gpus(topology: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The first ``count`` visible GPUs (the ones a job with gpus=count runs on)."""
    return list(topology.get("gpus", []))[:count]


def job_interconnect(topology: dict[str, Any], count: int) -> str:
    """How the job's GPUs exchange collectives: "nvlink" (all pairs NVLink with P2P), "pcie-p2p" (P2P over
    PCIe), "pcie-host" (through host memory), or "none" (one GPU)."""
    if count < 2:
        return "none"
    pairs = [lk for lk in topology.get("links", []) if lk["a"] < count and lk["b"] < count]
    if not pairs or any(not lk["p2p"] for lk in pairs):
        return "pcie-host"
    return "nvlink" if all(lk["kind"] == "nvlink" for lk in pairs) else "pcie-p2p"


def main() -> None:
    print(json.dumps(detect(), indent=1))


if __name__ == "__main__":
    main()
