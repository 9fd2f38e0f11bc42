import { describe, expect, it } from "vitest";
import { DEFAULT_VIEW, gradNormChart, jobWarnings, logTickLabels, lossChart, secondsTick, maxGradNorm, memoryChart, stepTimeChart, throughputChart, type ChartContext } from "./charts";
import type { MetricsRecord } from "./types";

const rec = (step: number, extra: Partial<MetricsRecord> = {}): MetricsRecord => ({
  step,
  loss: 2,
  step_time_s: 1,
  phases: { data: 0.01, forward: 0.3, backward: 0.6, update_tail: 0.05, update_busy: 0.8 },
  predicted: {},
  ...extra,
});
const none: ChartContext = { job: null };
const view = DEFAULT_VIEW;

describe("step-time chart", () => {
  it("stacks the spans that make up the step and draws waits and overlapped work as lines", () => {
    const plain = stepTimeChart.layout([rec(1), rec(2)], view, none);
    expect(plain.lines.map((l) => l.label)).toEqual(["forward", "backward", "step time", "data", "update tail", "update busy (overlapped)"]);
    expect(plain.stacked).toBe(2);
    expect(plain.lines.find((l) => l.label === "update tail")?.dash).toBeDefined();
    expect(plain.info).toEqual(["No predicted step time for this job (its plan had no measured figures to time it with)."]);
  });

  it("never stacks the parts of the updater's time, and keeps them one click away", () => {
    const r = rec(1, { phases: { forward: 0.3, backward: 0.6, staging_wait: 0.08, update_busy: 0.29, update_cast_busy: 0.08, update_offcpu: 0.08 } });
    const lay = stepTimeChart.layout([r], view, none);
    expect(lay.stacked).toBe(2);
    const shown = lay.lines.filter((l) => !l.hidden).map((l) => l.label);
    expect(shown).toEqual(["forward", "backward", "step time", "staging wait", "update busy (overlapped)"]);
    expect(lay.lines.filter((l) => l.hidden).map((l) => l.label)).toEqual(["update cast busy (overlapped)", "update offcpu (overlapped)"]);
  });

  it("draws the prediction only when there is one, and the predicted forward span against the measured forward", () => {
    const predicted = stepTimeChart.layout([rec(1), rec(2, { predicted: { step_time_s: 0.9, forward: 0.3 } })], view, none);
    const line = predicted.lines.find((l) => l.label === "predicted");
    expect(line?.dash).toBeDefined();
    expect(line?.get(rec(3, { predicted: { step_time_s: 0.9 } }))).toBe(0.9);
    expect(predicted.lines.some((l) => l.label === "predicted forward")).toBe(false);
    expect(predicted.info).toEqual([]);
    const r = rec(1, { predicted: { step_time_s: 0.9, forward_span: 0.35, backward_span: 0.55 } });
    const spans = stepTimeChart.layout([r], view, none);
    expect(spans.lines.find((l) => l.label === "predicted forward")?.get(r)).toBeCloseTo(0.35);
    expect(spans.signature).not.toBe(stepTimeChart.layout([rec(1)], view, none).signature);
  });

  it("leaves the warm-up step out of the scale and reads seconds as ms below a second", () => {
    const lay = stepTimeChart.layout([rec(1)], view, none);
    expect(lay.skipFirst).toBe(true);
    const fmt = lay.lines[0].format;
    expect(fmt?.(1.55e-4)).toBe("0.155 ms");
    expect(fmt?.(3.41)).toBe("3.41 s");
    expect(lay.axes[0].tick).toBe(secondsTick);
    expect([0, 0.0002, 0.05, 0.25, 1, 1.5].map(secondsTick)).toEqual(["0", "0.2 ms", "50 ms", "250 ms", "1 s", "1.5 s"]);
  });

  it("explains every line it draws", () => {
    const r = rec(1, { phases: { data: 0, forward: 0.3, backward: 0.6, update_tail: 0, staging_wait: 0, update_busy: 0.2, update_cast_busy: 0.1, update_offcpu: 0.05 }, predicted: { step_time_s: 1, forward_span: 0.3 } });
    for (const l of stepTimeChart.layout([r], view, none).lines) expect(l.hint, l.label).toBeTruthy();
  });
});

describe("throughput chart", () => {
  it("draws tokens/s on one axis only, with thousands separators", () => {
    const lay = throughputChart.layout([rec(1, { tokens_per_s: 29440.9, tflops: 300, hbm_peak_gib: [90] })], view, none);
    expect(lay.axes).toHaveLength(1);
    expect(lay.lines.map((l) => l.label)).toEqual(["tokens/s"]);
    expect(lay.lines[0].format?.(29440.9)).toBe("29,441 tokens/s");
    expect(lay.skipFirst).toBe(true);
  });

  it("says TFLOP/s in words on GPU runs and not at all on CPU runs", () => {
    const gpu = [1, 2, 3].map((s) => rec(s, { tokens_per_s: 1000, tflops: 300 + s, mfu: 0.3, hbm_peak_gib: [90] }));
    expect(throughputChart.layout(gpu, view, none).info).toEqual(["Model compute: 302 TFLOP/s (MFU 30 %), median of the last 3 steps."]);
    const cpu = [1, 2].map((s) => rec(s, { tokens_per_s: 100, tflops: 0.0002, mfu: null, hbm_peak_gib: [] }));
    expect(throughputChart.layout(cpu, view, none).info).toEqual([]);
    const zero = [rec(1, { tflops: 0, hbm_peak_gib: [1] })];
    expect(throughputChart.layout(zero, view, none).info).toEqual([]);
  });
});

describe("memory chart", () => {
  it("draws one HBM line per GPU the records report, plus host RSS, all in GiB", () => {
    const lay = memoryChart.layout([rec(1, { hbm_peak_gib: [10, 11], host_rss_gib: 100 })], view, none);
    expect(lay.lines.map((l) => l.label)).toEqual(["GPU 0 HBM peak", "GPU 1 HBM peak", "host RSS"]);
    expect(lay.lines[1].get(rec(1, { hbm_peak_gib: [10, 11] }))).toBe(11);
    expect(lay.lines[2].format?.(96.185)).toBe("96.2 GiB");
    expect(lay.axes.map((a) => a.label)).toEqual(["GiB"]);
    expect(memoryChart.layout([rec(1, { hbm_peak_gib: [] })], view, none).lines.map((l) => l.label)).toEqual(["host RSS"]);
  });
});

describe("loss chart", () => {
  it("marks and reports non-finite losses", () => {
    const recs = [rec(1), rec(2, { loss: NaN }), rec(3, { loss: null }), rec(4)];
    const lay = lossChart.layout(recs, view, none);
    expect(lay.marks?.(recs)).toEqual([2, 3]);
    expect(lay.note?.(recs)).toBe("Loss is not a finite number at 2 steps (first: step 2, last: step 3).");
    expect(lay.note?.([rec(1)])).toBeNull();
  });

  it("switches the loss axis to log10 and back, the lr axis staying linear", () => {
    const lin = lossChart.layout([rec(1)], view, none);
    const log = lossChart.layout([rec(1)], { ...view, log: true }, none);
    expect(lin.axes.map((a) => !!a.log)).toEqual([false, false]);
    expect(log.axes.map((a) => !!a.log)).toEqual([true, false]);
    expect(log.signature).not.toBe(lin.signature);
  });

  it("keeps the raw loss first and adds its moving average over the whole run when smoothing", () => {
    const recs = [rec(1, { loss: 10 }), rec(2, { loss: 0 }), rec(3, { loss: 0 })];
    const raw = lossChart.layout(recs, view, none);
    expect(raw.lines.map((l) => l.label)).toEqual(["loss", "lr"]);
    const smooth = lossChart.layout(recs, { ...view, smoothing: 0.5 }, none);
    expect(smooth.lines.map((l) => l.label)).toEqual(["loss", "loss (smoothed)", "lr"]);
    expect(smooth.lines[0].colour).toMatch(/^rgba\(/); // faint beneath
    const avg = smooth.lines[1].column?.(recs) ?? [];
    expect(avg[0]).toBeCloseTo(10);
    expect(avg[1]).toBeCloseTo(10 / 3);
    expect(avg[2]).toBeCloseTo(10 / 7);
  });

  it("draws eval loss only when records carry it, as points at those steps", () => {
    expect(lossChart.layout([rec(1), rec(2)], view, none).lines.some((l) => l.label === "eval loss")).toBe(false);
    const recs = [rec(1), rec(2, { eval_loss: 2.5 }), rec(3)];
    const line = lossChart.layout(recs, view, none).lines.find((l) => l.label === "eval loss");
    expect(line?.sparse).toBe(true);
    expect(recs.map((r) => line?.get(r))).toEqual([undefined, 2.5, undefined]);
  });
});

describe("grad-norm chart", () => {
  const job = (max: number) => ({ job: { config: { optimizer: { max_grad_norm: max } }, warnings: undefined } });

  it("draws the norm, the clipped steps as points and the threshold when clipping is on", () => {
    const recs = [rec(1, { grad_norm: 5, clipped: true }), rec(2, { grad_norm: 0.5, clipped: false }), rec(3, { grad_norm: 2, clipped: true })];
    const lay = gradNormChart.layout(recs, view, job(1));
    expect(lay.lines.map((l) => l.label)).toEqual(["grad norm", "clipped", "max grad norm"]);
    const clipped = lay.lines[1];
    expect(clipped.pointsOnly).toBe(true);
    expect(recs.map((r) => clipped.get(r))).toEqual([5, null, 2]);
    expect(clipped.describe?.(recs[1])).toBe("no");
    expect(lay.lines[2].get(recs[0])).toBe(1);
    expect(lay.info).toEqual(["Clipped at 2 of 3 steps (max grad norm 1)."]);
  });

  it("says when clipping is off or the records have no norm", () => {
    const off = gradNormChart.layout([rec(1, { grad_norm: 3, clipped: false })], view, job(0));
    expect(off.lines.map((l) => l.label)).toEqual(["grad norm", "clipped"]);
    expect(off.info).toEqual(["No clipping (max grad norm 0): the norm is reported only."]);
    expect(gradNormChart.layout([rec(1)], view, none).info).toEqual(["These records carry no gradient norm."]);
    expect(gradNormChart.layout([rec(1)], { ...view, log: true }, none).axes[0].log).toBe(true);
  });

  it("reads the threshold from the job config", () => {
    expect(maxGradNorm(null)).toBeNull();
    expect(maxGradNorm({ config: {} })).toBeNull();
    expect(maxGradNorm({ config: { optimizer: { max_grad_norm: 0 } } })).toBeNull();
    expect(maxGradNorm({ config: { optimizer: { max_grad_norm: 1.5 } } })).toBe(1.5);
  });
});

describe("job warnings", () => {
  it("are none when the job has none, and only the well-formed ones otherwise, in step order", () => {
    expect(jobWarnings(null)).toEqual([]);
    expect(jobWarnings({})).toEqual([]);
    expect(jobWarnings({ warnings: null })).toEqual([]);
    expect(
      jobWarnings({
        warnings: [{ step: 9, kind: "loss_spike", message: "loss 7e6" }, { kind: "x" }, null, { step: 2, kind: "slow_step", message: "3 s" }, { step: 4 }],
      }),
    ).toEqual([
      { step: 2, kind: "slow_step", message: "3 s" },
      { step: 4, kind: "warning", message: "" },
      { step: 9, kind: "loss_spike", message: "loss 7e6" },
    ]);
  });
});

describe("log axis labels", () => {
  const decade = (k: number) => [1, 2, 3, 4, 5, 6, 7, 8, 9].map((m) => m * 10 ** k);
  it("label 1, 2 and 5 of each decade when there is room", () => {
    expect(logTickLabels([...decade(0), 10], 170)).toEqual(["1", "2", "", "", "5", "", "", "", "", "10"]);
  });
  it("label only the powers of ten on a tall range, and every other one when tighter", () => {
    const splits = [0, 1, 2, 3, 4, 5, 6].flatMap(decade);
    const some = logTickLabels(splits, 170).filter(Boolean);
    expect(some).toEqual(["1", "10", "100", "1000", "10k", "100k", "1M"]);
    const tight = logTickLabels([...[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12].flatMap(decade)], 170).filter(Boolean);
    expect(tight.length).toBeLessThanOrEqual(8);
    expect(tight[0]).toBe("1");
  });
});
