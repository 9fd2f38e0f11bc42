import { describe, expect, it } from "vitest";
import { readHost } from "./topology";

// The nvidia-h200-x2 GPU machine (2 × H200, NV18, PCIe Gen5 x16, one NUMA node, 32 cores, 256 GiB) in the
// shape slidedp.planning.topology.detect() writes (docs/interfaces.md §4).
const h200x2 = {
  schema: 1,
  hostname: "gpu-host",
  gpus: [0, 1].map((i) => ({
    index: i,
    physical_index: i,
    uuid: `GPU-${i}`,
    name: "NVIDIA H200",
    hbm_bytes: 143771 * 2 ** 20,
    bus_id: `0000:${i}8:00.0`,
    pcie: { gen: 5, width: 16, max_gen: 5, max_width: 16, source: "sysfs" },
    numa_node: 0,
  })),
  gpu_source: "nvidia-smi",
  links: [{ a: 0, b: 1, kind: "nvlink", p2p: true, detail: "NV18", hardware: "nvlink" }],
  p2p_disabled: false,
  cpu: { cores: 32, logical_cpus: 32, quota_cores: null, model: "Intel(R) Xeon(R)", numa_nodes: 1 },
  host_ram: { limit_bytes: 256 * 2 ** 30, source: "cgroup", memtotal_bytes: 31 * 2 ** 30 },
  notes: [],
};

describe("readHost", () => {
  it("reads GPUs, HBM, PCIe, the NVLink pair, cores and the RAM limit (not MemTotal)", () => {
    const v = readHost(h200x2, null);
    expect(v.gpus.map((g) => [g.index, g.name, g.pcie, g.numa])).toEqual([
      [0, "NVIDIA H200", "PCIe Gen5 x16", 0],
      [1, "NVIDIA H200", "PCIe Gen5 x16", 0],
    ]);
    expect(v.gpus[0].hbmGiB).toBeCloseTo(140.4, 1);
    expect(v.links).toEqual([{ a: 0, b: 1, kind: "NVLink", detail: "NV18", bandwidthGBs: null, p2p: true }]);
    expect([v.cpuCores, v.cpuThreads, v.numaNodes, v.ramGiB, v.ramSource]).toEqual([32, 32, 1, 256, "cgroup"]);
  });

  it("shows no bandwidth it was not given, and takes measured figures from the calibration", () => {
    expect(readHost(h200x2, null).gpus[0].h2dGBs).toBeNull();
    const v = readHost(h200x2, { h2d_gbps: [54.7, 53.2], d2h_gbps: [55.3, 55.1], p2p_gbps: [[0, 390], [390, 0]] });
    expect(v.gpus.map((g) => [g.h2dGBs, g.d2hGBs])).toEqual([[54.7, 55.3], [53.2, 55.1]]);
    expect(v.links[0].bandwidthGBs).toBe(390);
  });

  it("says when P2P is off and the pair goes through host memory", () => {
    const v = readHost({ ...h200x2, links: [{ a: 0, b: 1, kind: "pcie-host", p2p: false, detail: "NV18", hardware: "nvlink" }] }, null);
    expect(v.links[0].kind).toBe("PCIe via host memory");
    expect(v.links[0].p2p).toBe(false);
  });

  it("copes with a CPU-only host and with missing fields", () => {
    const v = readHost({ gpus: [], links: [], cpu: { cores: 2 } }, null);
    expect(v.gpus).toEqual([]);
    expect([v.cpuCores, v.ramGiB, v.numaNodes, v.cpuModel]).toEqual([2, null, null, null]);
    expect(readHost({}, null).gpus).toEqual([]);
  });

  it("marks a PCIe link trained below its maximum", () => {
    const gpu = { ...h200x2.gpus[0], pcie: { gen: 1, width: 16, max_gen: 5, max_width: 16 } };
    expect(readHost({ gpus: [gpu] }, null).gpus[0].pcie).toBe("PCIe Gen1 x16 (max Gen5 x16)");
  });

  it("reads the copy rates of a calibration record, or of a map of records keyed by shape", () => {
    const record = { transfers: { chunk_mib: [64, 512], h2d_GBps: [50.1, 54.7], d2h_GBps: [55.25, 55.0] }, unit: { params: 1 } };
    for (const cal of [record, { "qwen3-8b_bs8_nvlink": record }, { dir: "/cache", entries: [record] }]) {
      const v = readHost(h200x2, cal);
      // h2d_GBps is GPU 0 alone: GPU 1 gets no figure rather than a borrowed one.
      expect(v.gpus.map((g) => [g.h2dGBs, g.d2hGBs])).toEqual([[54.7, 55.25], [null, null]]);
      expect(v.links[0].bandwidthGBs).toBeNull();
    }
  });

  it("takes each GPU's own measured rate from transfers.per_gpu", () => {
    const record = { transfers: { h2d_GBps: [54.7], d2h_GBps: [55.3], per_gpu: [{ gpu: 0, h2d_GBps: 54.7, d2h_GBps: 55.3 }, { gpu: 1, h2d_GBps: 53.9, d2h_GBps: 55.0 }] } };
    const v = readHost(h200x2, { dir: "/cache", entries: [record] });
    expect(v.gpus.map((g) => [g.h2dGBs, g.d2hGBs])).toEqual([[54.7, 55.3], [53.9, 55.0]]);
  });
});
