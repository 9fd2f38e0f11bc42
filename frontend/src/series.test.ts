import { describe, expect, it } from "vitest";
import type { MetricsRecord } from "./types";
import { column, gpuCount, MetricsStore, nonFiniteLossSteps, phaseNames, pickIndices, stack } from "./series";

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
