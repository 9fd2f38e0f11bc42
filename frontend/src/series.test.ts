import { describe, expect, it } from "vitest";
import type { MetricsRecord } from "./types";
import { autoExtent, column, ema, gpuCount, isOverlapped, linearRange, logRange, MetricsStore, nonFiniteLossSteps, phaseKind, phaseNames, pickIndices, presentIndices, stack } from "./series";

describe("MetricsStore", () => {
  it("keeps records unique by step and in step order whatever the arrival order", () => {
    const s = new MetricsStore();
    for (const step of [3, 1, 2, 5, 4, 2]) s.add({ step, loss: step * 10 });
    expect(s.records.map((r) => r.step)).toEqual([1, 2, 3, 4, 5]);
    expect(s.lastStep).toBe(5);
  });

  it("replaces a repeated step with the newer record (a resumed run redoing steps)", () => {
    const s = new MetricsStore();
    s.addMany([{ step: 1, loss: 5 }, { step: 2, loss: 4 }]);
    s.add({ step: 2, loss: 3.5 });
    expect(s.records[1].loss).toBe(3.5);
    expect(s.length).toBe(2);
  });

  it("rejects records without a numeric step", () => {
    const s = new MetricsStore();
    expect(s.add({ step: NaN })).toBe(false);
    expect(s.add({} as never)).toBe(false);
    expect(s.length).toBe(0);
  });

  it("reports the end of the gap-free prefix for catch-up reads", () => {
    const s = new MetricsStore();
    s.addMany([1, 2, 3, 5, 6].map((step) => ({ step })));
    expect(s.contiguousStep()).toBe(3);
    s.add({ step: 4 });
    expect(s.contiguousStep()).toBe(6);
  });
});

describe("pickIndices", () => {
  it("draws every point of a short run", () => {
    expect(pickIndices(5, [[1, 2, 3, 4, 5]], 100)).toEqual([0, 1, 2, 3, 4]);
  });

  it("bounds a long run, keeps its spike, its NaN and its last point", () => {
    const n = 100_000;
    const ys = Array.from({ length: n }, (_, i) => Math.sin(i / 1000));
    ys[54_321] = 50; // a spike
    ys[77_777] = NaN; // a diverged step
    const idx = pickIndices(n, [ys], 1000);
    expect(idx.length).toBeLessThanOrEqual(1000);
    expect(idx.length).toBeGreaterThan(300);
    expect(idx).toContain(54_321);
    expect(idx).toContain(77_777);
    expect(idx[0]).toBe(0);
    expect(idx[idx.length - 1]).toBe(n - 1);
    expect([...idx].sort((a, b) => a - b)).toEqual(idx);
  });

  it("keeps each series' extremes in a shared x", () => {
    const n = 10_000;
    const a = Array.from({ length: n }, () => 1);
    const b = Array.from({ length: n }, () => 1);
    a[1234] = 9;
    b[8765] = -9;
    const idx = pickIndices(n, [a, b], 500);
    expect(idx).toContain(1234);
    expect(idx).toContain(8765);
  });
});

describe("record helpers", () => {
  const recs: MetricsRecord[] = [
    { step: 1, loss: 2.5, phases: { forward: 0.1, backward: 0.2, custom: 0.01 }, hbm_peak_gib: [1, 2] },
    { step: 2, loss: NaN, phases: { data: 0.01, forward: 0.1 }, hbm_peak_gib: [] },
    { step: 3, loss: null, phases: {} },
    { step: 4 },
  ];

  it("finds steps whose loss is NaN or was nulled, not steps without a loss key", () => {
    expect(nonFiniteLossSteps(recs)).toEqual([2, 3]);
  });

  it("orders phases as the step runs them, unknown ones after", () => {
    expect(phaseNames(recs)).toEqual(["data", "forward", "backward", "custom"]);
  });

  it("counts GPUs from the widest HBM list", () => {
    expect(gpuCount(recs)).toBe(2);
    expect(gpuCount([{ step: 1, hbm_peak_gib: [] }])).toBe(0);
  });

  it("turns missing values into gaps and keeps NaN", () => {
    const c = column(recs, (r) => r.loss);
    expect(c[0]).toBe(2.5);
    expect(Number.isNaN(c[1] as number)).toBe(true);
    expect(c[2]).toBeNull();
    expect(c[3]).toBeNull();
  });

  it("stacks parts cumulatively, a step with no part at all stays a gap", () => {
    expect(stack([[1, null, 2], [3, null, null]])).toEqual([[1, null, 2], [4, null, 2]]);
  });
});

describe("smoothing", () => {
  it("is the values themselves at weight 0", () => {
    expect(ema([3, 1, 4, 1, 5], 0)).toEqual([3, 1, 4, 1, 5]);
  });

  it("is a bias-corrected exponential moving average", () => {
    const out = ema([2, 4, 4], 0.5);
    // 2; (0.5*1 + 0.5*... ) -> weights 1/3, 2/3 on 2 and 4; then 1/7, 2/7, 4/7
    expect(out[0]).toBeCloseTo(2);
    expect(out[1]).toBeCloseTo((2 * 0.5 + 4) / 1.5);
    expect(out[2]).toBeCloseTo((2 * 0.25 + 4 * 0.5 + 4) / 1.75);
    // a constant stays constant from the first point on: no pull towards zero
    expect(ema([6.2, 6.2, 6.2], 0.99).map((v) => Number(v?.toFixed(9)))).toEqual([6.2, 6.2, 6.2]);
  });

  it("skips NaN and missing values without losing the average", () => {
    const out = ema([1, NaN, null, 1], 0.9);
    expect(out[1]).toBeNull();
    expect(out[2]).toBeNull();
    expect(out[3]).toBeCloseTo(1);
  });

  it("damps a spike: 7e6 at step 2 no longer dominates a few steps later at a heavy weight of the recent past", () => {
    const vals = [10, 7e6, ...Array.from({ length: 200 }, () => 6.238)];
    const out = ema(vals, 0.6);
    expect(out[1]).toBeGreaterThan(1e6);
    expect(out[60]).toBeCloseTo(6.238, 2);
  });

  it("clamps its weight to [0, 0.999]", () => {
    expect(ema([1, 2], -1)).toEqual([1, 2]);
    expect(ema([1, 2], 5)[1]).toBeGreaterThan(1);
  });
});

describe("autoscale", () => {
  it("leaves the warm-up step out of the range and reports it", () => {
    const stepTime = [3.6, 0.55, 0.56, 0.57];
    expect(autoExtent([stepTime])).toEqual({ min: 0.55, max: 3.6, first: null });
    expect(autoExtent([stepTime], true)).toEqual({ min: 0.55, max: 0.57, first: 3.6 });
    const [lo, hi] = linearRange(0.55, 0.57);
    expect(lo).toBe(0);
    expect(hi).toBeLessThan(3.6);
  });

  it("does not report a first step that lies within the later ones", () => {
    expect(autoExtent([[0.56, 0.55, 0.57]], true)?.first).toBeNull();
  });

  it("reports a first step below the later ones (a slow first step's throughput)", () => {
    expect(autoExtent([[100, 900, 1000]], true)).toEqual({ min: 900, max: 1000, first: 100 });
  });

  it("takes every column into account and the first step when it is all there is", () => {
    expect(autoExtent([[5, 1, null], [null, 2, 3]], true)).toEqual({ min: 1, max: 3, first: 5 });
    expect(autoExtent([[4], [null]], true)).toEqual({ min: 4, max: 4, first: null });
    expect(autoExtent([[null, NaN]], true)).toBeNull();
  });

  it("keeps only positive values for a log axis, and ranges over whole decades", () => {
    expect(autoExtent([[0, 7e6, 6.2, -1]], false, true)).toEqual({ min: 6.2, max: 7e6, first: null });
    expect(logRange(6.2, 7e6)).toEqual([1, 1e7]);
    expect(logRange(10, 10)).toEqual([1, 100]);
  });

  it("starts a linear axis at 0 for non-negative values and leaves head room", () => {
    expect(linearRange(2, 4)).toEqual([0, 4.2]);
    expect(linearRange(-2, 2)).toEqual([-2, 2.2]);
    expect(linearRange(null, null)).toEqual([0, 1]);
  });
});

describe("phases", () => {
  it("stacks only the spans that make up the step", () => {
    expect(["forward", "backward"].map(phaseKind)).toEqual(["span", "span"]);
    expect(["data", "update_tail", "staging_wait", "delivery_wait", "mystery"].map(phaseKind)).toEqual(["wait", "wait", "wait", "wait", "wait"]);
    expect(["update_busy", "update_cast_busy", "update_offcpu", "other_busy"].every(isOverlapped)).toBe(true);
  });

  it("finds the steps a sparse series has", () => {
    expect(presentIndices([null, 2, NaN, 3])).toEqual([1, 3]);
  });
});
