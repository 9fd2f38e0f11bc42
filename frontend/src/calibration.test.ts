import { describe, expect, it } from "vitest";
import { castLines, copyLines, copyRates, hostDram, hostDramLines, matchWords, measuredLines, observedLines, perGiB, summarizeCalibration } from "./calibration";
import { readHost, softwareLines } from "./topology";

// The nvidia-h200-x2 fixture record (tests/runtime/fixtures/h200x2_calibration.json, qwen3-8b_bs8_nvlink) as the
// API answers it: written by schema 1 without heads/kv_heads/vocab, filled in from the model config.
const upgraded = {
  schema: 1,
  key: "fixture-qwen3-8b-bs8-nvlink",
  created_at: "2026-11-29T00:00:00Z",
  quick: false,
  device: "cuda",
  world: 2,
  interconnect: "nvlink",
  shape: { model: "qwen3-8b", arch: "qwen3", micro_batch: 8, seq: 2048, hidden: 4096, intermediate: 12288, layers: 36, precision: "bf16", heads: 32, kv_heads: 8, vocab: 151936 },
  shape_upgraded: ["heads", "kv_heads", "vocab"],
  transfers: { chunk_mib: [64, 512], h2d_GBps: [54.7, 54.7], d2h_GBps: [55.25, 55.25], h2d_all_GBps: [53.17, 53.17], d2h_all_GBps: [54.45, 54.45], bidir_GBps: 93.52, latency_s: 1e-5 },
  pinned_alloc_s_per_gib: 0.55775,
  host_dram: { threads: 32, adamw_alone_s_per_1e9: 0.1953, adamw_with_dma_s_per_1e9: 0.3182, dma_alone_GBps: 136.0, dma_with_adamw_GBps: 80.98, capacity_GBps: 168.97 },
  cpu: { threads: [8, 16, 32], copy_GBps: [46.08, 70.0, 100.94] },
};

describe("summarizeCalibration", () => {
  it("says the shape, the model's dimensions, when and by what it was measured, and that it was upgraded", () => {
    const s = summarizeCalibration(upgraded, 5);
    expect(s.title).toBe("qwen3-8b at micro-batch 8 × 2,048 tokens, bf16");
    expect(s.model).toBe("hidden 4,096, 36 layers, 32 attention heads (8 KV heads), vocabulary 151,936");
    expect(s.measured).toBe("measured 2026-11-29 00:00 UTC on 2 GPUs over NVLink");
    expect(s.version).toBe("calibration schema 1 (this runtime writes 5); slidedp version not recorded");
    expect(s.state).toBe("upgraded");
    expect(s.stateText).toBe("upgraded: an older runtime wrote it without attention heads, KV heads and vocabulary, filled in from the model config; a run measures the shape again");
  });

  it("marks a record of this schema current, an older complete one older, an underivable one outdated", () => {
    const current = { ...upgraded, schema: 5, shape_upgraded: undefined, software: { torch: "2.11.0", cuda: "13.0", slidedp: "0.1.0" } };
    expect(summarizeCalibration(current, 5).state).toBe("current");
    expect(summarizeCalibration(current, 5).version).toBe("calibration schema 5; slidedp 0.1.0; torch 2.11.0; CUDA 13.0");
    expect(summarizeCalibration({ ...current, schema: 4 }, 5).state).toBe("older");
    const old = { ...upgraded, shape: { model: "gone-model", micro_batch: 8, seq: 2048, hidden: 64 }, shape_upgraded: undefined, outdated: "it lacks heads and the config of model 'gone-model' is not known here" };
    const s = summarizeCalibration(old, 5);
    expect(s.state).toBe("outdated");
    expect(s.model).toBe("hidden 64, not recorded layers, attention heads not recorded, vocabulary not recorded");
    expect(s.stateText).toBe("outdated: it lacks heads and the config of model 'gone-model' is not known here; no plan uses it");
  });
});

describe("measured rates in units people use", () => {
  it("says pinned allocation in ms per GiB, not seconds per a fraction of a GiB", () => {
    expect(perGiB(0.55775)).toBe("558 ms per GiB");
    expect(perGiB(1.5)).toBe("1.5 s per GiB");
    expect(perGiB(undefined)).toBe("not measured");
  });

  it("gives host<->GPU copies alone and with every GPU copying, and not measured where absent", () => {
    expect(copyLines(copyRates(upgraded))).toEqual([
      "host → GPU: 54.7 GB/s one GPU alone, 53.2 GB/s per GPU with all copying at once",
      "GPU → host: 55.3 GB/s one GPU alone, 54.5 GB/s per GPU with all copying at once",
      "one GPU copying both ways at once: 93.5 GB/s in all",
    ]);
    expect(copyLines(copyRates({ transfers: { h2d_GBps: [12] } }))[1]).toBe("GPU → host: not measured one GPU alone, not measured per GPU with all copying at once");
  });

  it("says how much host memory bandwidth the copies lose while the CPU update runs", () => {
    expect(hostDramLines(hostDram(upgraded))).toEqual([
      "GPU copies through host memory: 136 GB/s alone, 81 GB/s while the CPU update runs (40% less)",
      "CPU update (32 threads): 195 ms per 10⁹ parameters alone, 318 ms beside the copies (63% longer)",
      "host memory the two share: 169 GB/s",
    ]);
    expect(hostDramLines(hostDram({}))).toEqual(["host memory bandwidth: not measured (a quick or CPU calibration leaves it out)"]);
    expect(measuredLines(upgraded)).toContain("pinned allocation: 558 ms per GiB");
    expect(measuredLines(upgraded)).toContain("host memory copy: 101 GB/s at 32 threads");
  });

  it("says the host speed the runs planned with the record measured, per clipping state", () => {
    const seen = { ...upgraded, observed_host: { clipped: [{ factor: 1.3 }, { factor: 1.1 }, { factor: 1.2 }, { factor: 9 }], unclipped: [{ factor: 1.05 }] } };
    expect(observedLines(seen)).toEqual([
      "runs without clipping: the host update took 1.05× what their plans charged (median of 1 run)",
      "runs with clipping: the host update took 1.20× what their plans charged (median of 3 runs)",
    ]);
    expect(measuredLines(seen).slice(-2)).toEqual(observedLines(seen));
    expect(observedLines(upgraded)).toEqual([]);
  });
});

describe("matchWords", () => {
  it("names the record that priced the plan and that it was upgraded", () => {
    const m = matchWords({ used: { ...upgraded, current_schema: 5 }, why_not: [], run: null });
    expect(m?.used).toBe(true);
    expect(m?.text).toBe(
      "Step times from the calibration measured 2026-11-29 00:00 UTC on 2 GPUs over NVLink for qwen3-8b at micro-batch 8 × 2,048 tokens, bf16. " +
        "It is upgraded: an older runtime wrote it without attention heads, KV heads and vocabulary, filled in from the model config; a run measures the shape again.",
    );
  });

  it("says why each record does not fit and what to run", () => {
    const m = matchWords({
      used: null,
      why_not: [{ record: upgraded, why: ["micro-batch 8, not 2"] }],
      run: "slidedp bench --model qwen3-8b --gpus 2 --mbs 2 --seq 2048 --plan-only",
    });
    expect(m?.used).toBe(false);
    expect(m?.text).toBe("None of this host's 1 calibration fits this job, so the plan checks memory only and predicts no step time.");
    expect(m?.reasons).toEqual(["qwen3-8b at micro-batch 8 × 2,048 tokens, bf16 (2026-11-29 00:00 UTC): micro-batch 8, not 2"]);
    expect(m?.run).toBe("slidedp bench --model qwen3-8b --gpus 2 --mbs 2 --seq 2048 --plan-only");
    expect(matchWords(undefined)).toBeNull();
  });
});

describe("the topology's numbers", () => {
  it("says each software version the topology reports and which it does not", () => {
    expect(softwareLines({ software: { python: "3.12", torch: "2.11.0+cu130", cuda: "13.0", nccl: null, transformers: "5.17.0" } })).toEqual([
      "torch 2.11.0+cu130",
      "CUDA 13.0",
      "NVIDIA driver not reported",
      "NCCL not reported",
      "Python 3.12",
      "transformers 5.17.0",
    ]);
    expect(softwareLines({})).toEqual(["software versions not reported"]);
  });

  it("reads the copy rates with all GPUs at once and the host memory figures from the calibration", () => {
    const v = readHost({ gpus: [{ index: 0 }, { index: 1 }] }, { dir: "/c", entries: [upgraded] });
    expect([v.copies?.h2dAll, v.copies?.d2hAll]).toEqual([53.17, 54.45]);
    expect([v.hostDram?.copyAloneGBps, v.hostDram?.copyBesideUpdateGBps]).toEqual([136, 80.98]);
    expect(readHost({ gpus: [] }, null).copies).toBeNull();
  });
});

describe("the delivery cast's figure", () => {
  const figure = {
    params: 218_112_000, bytes: 872_448_000, forward_s: 0.0131, chunk_mib: [16, 64, 256],
    default: [{ alone_s: 0.0168, beside_s: 0.026, forwards: 3 }, { alone_s: 0.0159, beside_s: 0.0223, forwards: 4 }, { alone_s: 0.0158, beside_s: 0.019, forwards: 4 }],
    ring_mib: 256, ring_chunk_mib: 64, ring: { alone_s: 0.016, beside_s: 0.0165, forwards: 4 },
  };
  it("says a layer's delivery alone and beside its forward, with and without the scratch", () => {
    expect(castLines({ delivery_cast: figure })).toEqual([
      "a layer's weights cast on the GPU (0.872 GB of fp32): 15.9 ms alone, 22.3 ms beside its forward (40% longer)",
      "the same through 256 MiB of cast scratch: 16 ms alone, 16.5 ms beside its forward (3% longer)",
    ]);
  });
  it("says why it was not measured, and nothing for a record without it", () => {
    expect(castLines({ delivery_cast: { error: "OutOfMemoryError: CUDA out of memory" } })).toEqual([
      "a layer's weights cast on the GPU: not measured (OutOfMemoryError: CUDA out of memory)",
    ]);
    expect(castLines({})).toEqual([]);
  });
});
