"""Topology detection: parsers fed with output captured on the nvidia-h200-x2 machine, cgroup and sysfs
readers on real files, and detect() on this host (which has no GPU)."""

import json
import os
import subprocess
import sys

import pytest
from slidedp.planning import topology

# `nvidia-smi topo -m` as captured on the nvidia-h200-x2 machine (its hardware probe of 2026-11-29).
X2_TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)
# The same layout for a PCIe-only workstation and the P2P capability matrix (`nvidia-smi topo -p2p r`).
PCIE_TOPO = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-15\t0\nGPU1\tPHB\t X \t0-15\t0\n"
P2P_NS = "\tGPU0\tGPU1\t\nGPU0\tX\tNS\t\nGPU1\tNS\tX\t\n\nLegend:\n  X    = Self\n  OK   = Status Ok\n"
X2_QUERY = (
    "0, GPU-aaaa1111, NVIDIA H200, 143771, 00000000:19:00.0, 5, 5, 16, 16\n"
    "1, GPU-bbbb2222, NVIDIA H200, 143771, 00000000:3B:00.0, 5, 5, 16, 16\n"
)


def test_parses_the_nvlink_matrix_of_the_x2_machine():
    parsed = topology.parse_topo_matrix(X2_TOPO)
    assert parsed["pairs"] == {(0, 1): "NV18", (1, 0): "NV18"}
    assert parsed["numa"] == {0: 0, 1: 0}
    link = topology._link(0, 1, parsed["pairs"][(0, 1)], None, p2p_disabled=False)
    assert link == {"a": 0, "b": 1, "kind": "nvlink", "p2p": True, "detail": "NV18", "hardware": "nvlink"}


def test_nccl_p2p_disable_turns_nvlink_into_host_memory_links():
    link = topology._link(0, 1, "NV18", True, p2p_disabled=True)
    assert link["kind"] == "pcie-host" and link["p2p"] is False and link["hardware"] == "nvlink"


def test_pcie_pair_without_p2p_support():
    pairs = topology.parse_topo_matrix(PCIE_TOPO)["pairs"]
    p2p = topology.parse_topo_matrix(P2P_NS)["pairs"]
    link = topology._link(0, 1, pairs[(0, 1)], p2p[(0, 1)] == "OK", p2p_disabled=False)
    assert (link["kind"], link["p2p"], link["detail"]) == ("pcie", False, "PHB")


def test_gpu_query_rows_and_cuda_visible_devices_renumbering():
    rows = topology.parse_gpu_query(X2_QUERY)
    assert [r["hbm_bytes"] for r in rows] == [143771 * 2**20] * 2
    assert (rows[1]["gen"], rows[1]["width"], rows[1]["bus_id"]) == (5, 16, "00000000:3B:00.0")
    assert [g["uuid"] for g in topology._visible(rows, "1")] == ["GPU-bbbb2222"]
    assert [g["index"] for g in topology._visible(rows, "GPU-bbbb,0")] == [1, 0]
    assert topology._visible(rows, "") == []  # an empty mask hides every GPU, as in CUDA


def test_sysfs_pcie_link_generation_width_and_numa(tmp_path):
    dev = tmp_path / "bus/pci/devices/0000:3b:00.0"
    dev.mkdir(parents=True)
    for name, val in {
        "current_link_speed": "16.0 GT/s PCIe",
        "max_link_speed": "32.0 GT/s PCIe",
        "current_link_width": "8",
        "max_link_width": "16",
        "numa_node": "1",
    }.items():
        (dev / name).write_text(val + "\n")
    got = topology.sysfs_pcie("00000000:3B:00.0", root=str(tmp_path))
    assert got == {"gen": 4, "width": 8, "max_gen": 5, "max_width": 16, "numa_node": 1}
    assert topology.sysfs_pcie("00000000:99:00.0", root=str(tmp_path)) is None


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_wins_over_memtotal(tmp_path):
    _write(tmp_path / "proc/self/cgroup", "0::/jobs/worker\n")
    _write(tmp_path / "proc/meminfo", "MemTotal:       32000000 kB\n")
    _write(tmp_path / "sys/fs/cgroup/memory.max", "max\n")
    _write(tmp_path / "sys/fs/cgroup/jobs/worker/memory.max", str(200 * 2**30) + "\n")
    limit, source, memtotal = topology.host_ram_limit_bytes(root=str(tmp_path))
    assert (limit, source, memtotal) == (200 * 2**30, "cgroup", 32000000 * 1024)


def test_cgroup_v1_without_a_real_limit_falls_back_to_memtotal(tmp_path):
    _write(tmp_path / "proc/self/cgroup", "4:memory:/process_api/abc\n0::/\n")
    _write(tmp_path / "proc/meminfo", "MemTotal:       1000 kB\n")
    _write(tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    assert topology.host_ram_limit_bytes(root=str(tmp_path)) == (1000 * 1024, "meminfo", 1000 * 1024)
    _write(tmp_path / "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", str(64 * 2**30))
    assert topology.host_ram_limit_bytes(root=str(tmp_path))[:2] == (64 * 2**30, "cgroup")
    assert topology.host_ram_limit_bytes(100.0, root=str(tmp_path))[:2] == (100 * 2**30, "configured")


def test_detect_on_this_host_is_json_and_reports_usable_cores():
    topo = topology.detect(host_ram_gib=12.5)
    assert json.loads(json.dumps(topo)) == topo
    assert topo["cpu"]["cores"] == len(os.sched_getaffinity(0))
    assert topo["host_ram"]["limit_bytes"] == int(12.5 * 2**30) and topo["host_ram"]["source"] == "configured"
    assert topo["host_ram"]["memtotal_bytes"] > 0
    assert topo["shm"]["path"] == "/dev/shm" and topo["shm"]["free_bytes"] > 0
    assert topo["software"]["torch"] is not None
    assert len(topo["links"]) == len(topo["gpus"]) * (len(topo["gpus"]) - 1) // 2


FAKE_SMI = """#!{python}
import os, sys, time
args = sys.argv[1:]
calls = {calls!r}
open(os.path.join(calls, "%d-%s" % (os.getpid(), "_".join(a.strip("-")[:12] for a in args))), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(calls)) < 3:  # the three calls meet here: run one after another, the first never returns
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.01)
if args[0].startswith("--query-gpu"):
    sys.stdout.write({query!r})
elif args[:2] == ["topo", "-m"]:
    sys.stdout.write({topo!r})
elif args[:3] == ["topo", "-p2p", "r"]:
    sys.stdout.write({p2p!r})
else:
    sys.exit(2)
"""


def test_detect_asks_nvidia_smi_its_three_questions_at_once(tmp_path, monkeypatch):
    """Each nvidia-smi call can take a second where the driver is not kept loaded: detect() runs the GPU query
    and the two topology matrices together. This stand-in answers only once all three are running, so calls made
    one after another would never be answered and detection would fall back to torch."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, calls=str(calls), query=X2_QUERY, topo=PCIE_TOPO,
                                   p2p=P2P_NS))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    topo = topology.detect()
    assert topo["gpu_source"] == "nvidia-smi"
    assert [(g["name"], g["hbm_bytes"]) for g in topo["gpus"]] == [("NVIDIA H200", 143771 * 2**20)] * 2
    assert len(topo["links"]) == 1
    assert topo["links"][0]["hardware"] == "pcie" and topo["links"][0]["p2p"] is False
    assert len(os.listdir(calls)) == 3


def test_job_interconnect_summarises_the_links_of_the_jobs_gpus():
    nv = {"links": [topology._link(0, 1, "NV18", True, False)]}
    host = {"links": [topology._link(0, 1, "NV18", True, True)]}
    assert topology.job_interconnect(nv, 2) == "nvlink"
    assert topology.job_interconnect(host, 2) == "pcie-host"
    assert topology.job_interconnect(nv, 1) == "none"


def test_cli_prints_json_and_the_module_imports_no_torch():
    env = dict(os.environ, PYTHONPATH="runtime", NCCL_P2P_DISABLE="1")
    out = subprocess.run(
        [sys.executable, "-m", "slidedp.planning.topology"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout)["p2p_disabled"] is True
    probe = "import sys, slidedp.planning.topology; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_detect_agrees_with_torch_on_the_gpu_machine():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    topo = topology.detect()
    assert len(topo["gpus"]) == torch.cuda.device_count()
    for g in topo["gpus"]:
        total = torch.cuda.get_device_properties(g["index"]).total_memory
        assert abs(g["hbm_bytes"] - total) < 0.02 * total
        assert g["pcie"]["gen"] is not None and g["pcie"]["width"] is not None
    for lk in topo["links"]:
        if not topo["p2p_disabled"]:
            assert lk["p2p"] == torch.cuda.can_device_access_peer(lk["a"], lk["b"])
