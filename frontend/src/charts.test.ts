import { describe, expect, it } from "vitest";
import { lossChart, memoryChart, stepTimeChart, throughputChart } from "./charts";
import type { MetricsRecord } from "./types";

const rec = (step: number, extra: Partial<MetricsRecord> = {}): MetricsRecord => ({
  step,
  loss: 2,
  step_time_s: 1,
  phases: { data: 0.01, forward: 0.3, backward: 0.6, update_tail: 0.05, update_busy: 0.8 },
  predicted: {},
  ...extra,
});

describe("chart layouts follow the data", () => {
  it("stacks the step's phases, draws overlapped work as a line and the prediction only when there is one", () => {
    const plain = stepTimeChart.layout([rec(1), rec(2)]);
    expect(plain.lines.map((l) => l.label)).toEqual(["data", "forward", "backward", "update tail", "step time", "update busy (overlapped)"]);
    expect(plain.stacked).toBe(4);
    const predicted = stepTimeChart.layout([rec(1), rec(2, { predicted: { step_time_s: 0.9, forward: 0.3 } })]);
    const line = predicted.lines.find((l) => l.label === "predicted");
    expect(line?.dash).toBeDefined();
    expect(line?.get(rec(3, { predicted: { step_time_s: 0.9 } }))).toBe(0.9);
    expect(predicted.signature).not.toBe(plain.signature);
    expect(predicted.lines.some((l) => l.label === "predicted forward")).toBe(false);
  });

  it("draws the predicted forward span over the measured forward band when the prediction has spans", () => {
    const r = rec(1, { predicted: { step_time_s: 0.9, forward_span: 0.35, backward_span: 0.55 } });
    const lay = stepTimeChart.layout([r]);
    const line = lay.lines.find((l) => l.label === "predicted forward");
    // stacked on the data band, as the measured forward is
    expect(line?.get(r)).toBeCloseTo(0.36);
    expect(lay.stacked).toBe(4);
  });

  it("draws one HBM line per GPU the records report, plus host RSS", () => {
    const lay = memoryChart.layout([rec(1, { hbm_peak_gib: [10, 11], host_rss_gib: 100 })]);
    expect(lay.lines.map((l) => l.label)).toEqual(["GPU 0 HBM peak", "GPU 1 HBM peak", "host RSS"]);
    expect(lay.lines[1].get(rec(1, { hbm_peak_gib: [10, 11] }))).toBe(11);
    expect(memoryChart.layout([rec(1, { hbm_peak_gib: [] })]).lines.map((l) => l.label)).toEqual(["host RSS"]);
  });

  it("adds the TFLOP/s axis only when records have it", () => {
    expect(throughputChart.layout([rec(1, { tokens_per_s: 5 })]).axes).toHaveLength(1);
    expect(throughputChart.layout([rec(1, { tokens_per_s: 5, tflops: 0.1 })]).axes.map((a) => a.label)).toEqual(["tokens/s", "TFLOP/s"]);
  });

  it("marks and reports non-finite losses", () => {
    const recs = [rec(1), rec(2, { loss: NaN }), rec(3, { loss: null }), rec(4)];
    const lay = lossChart.layout(recs);
    expect(lay.marks?.(recs)).toEqual([2, 3]);
    expect(lay.note?.(recs)).toBe("Loss is not a finite number at 2 steps (first: step 2, last: step 3).");
    expect(lay.note?.([rec(1)])).toBeNull();
  });
});
