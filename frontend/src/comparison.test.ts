import { describe, expect, it } from "vitest";
import { clipText, configDiff, configText, COMPARED_METRICS, viewOf } from "./comparison";

describe("configDiff", () => {
  it("lists only the keys whose values differ, dotted, with the form's labels", () => {
    const a = { model: "tiny", steps: 12, optimizer: { lr: 3e-4, betas: [0.9, 0.95], max_grad_norm: 1 }, eval: { holdout: 0 }, report_to: null, output_dir: "/d/jobs/1" };
    const b = { model: "tiny", steps: 4, optimizer: { lr: 3e-4, betas: [0.9, 0.99], max_grad_norm: 1 }, eval: { holdout: 0.1 }, report_to: ["wandb"], output_dir: "/d/jobs/2" };
    const rows = configDiff([a, b]);
    expect(rows.map((r) => r.key)).toEqual(["steps", "optimizer.betas", "eval.holdout", "report_to"]);
    expect(rows[0]).toEqual({ key: "steps", label: "Steps", values: ["12", "4"] });
    expect(rows[1].values).toEqual(["[0.9,0.95]", "[0.9,0.99]"]);
    expect(rows[2].label).toBe("Held-out share of the training data");
    expect(rows[3].values).toEqual(["none", '["wandb"]']);
  });

  it("names a key only one job has, and nothing for one job or equal configs", () => {
    expect(configDiff([{ a: 1, s: { x: 1 } }, { a: 1 }], (k) => k)).toEqual([{ key: "s.x", label: "s.x", values: ["1", "–"] }]);
    expect(configDiff([{ a: 1 }])).toEqual([]);
    expect(configDiff([{ a: { b: 2 } }, { a: { b: 2 } }])).toEqual([]);
    expect(configText("x y")).toBe("x y");
  });
});

describe("viewOf", () => {
  const steps = [1, 2, 3, 4, 5, 6];

  it("leaves a diverged run's points out of the scale and marks its highest one", () => {
    const healthy = [11, 6, 4, 3.5, 3.2, 3];
    const diverged = [11, 6, 40, 5e4, 2e6, 9e5];
    const v = viewOf(steps, [{ run: 0, values: healthy }, { run: 1, values: diverged }]);
    // the healthy run's top is ~8.5, so the cap is ~85: 40 stays in the view, the rest is marked
    expect(v.max).toBe(40);
    expect(v.min).toBe(3);
    expect(v.clips).toEqual([{ run: 1, step: 5, value: 2e6, points: 3 }]);
    expect(clipText(7, v.clips[0], (x) => x.toExponential(1))).toBe("run #7 reached 2.0e+6 at step 5; 2 more of its points lie above the view");
    // without the cap the scale would be set by 2e6
    expect(v.log).toBe(false);
  });

  it("marks a single run's spike against its own usual values, and a run that went non-finite", () => {
    const values = Array.from({ length: 40 }, (_, i) => (i === 30 ? 500 : 2 + 0.01 * i));
    const many = Array.from({ length: 40 }, (_, i) => i + 1);
    const v = viewOf(many, [{ run: 0, values }], [null]);
    expect(v.clips).toEqual([{ run: 0, step: 31, value: 500, points: 1 }]);
    expect(v.max).toBeCloseTo(2.39, 6);
    const nan = viewOf(steps, [{ run: 0, values: [3, 2, null, null, null, null] }, { run: 1, values: [3, 2, 1.9, 1.8, 1.7, 1.6] }], [3, null]);
    expect(nan.clips).toEqual([{ run: 0, step: 3, value: null, points: 1 }]);
    expect(clipText(4, nan.clips[0], String, "loss")).toBe("run #4 reached a non-finite loss (NaN or infinity) at step 3");
  });

  it("turns the axis logarithmic when the shown values span two decades, unless the person chose", () => {
    const wide = [{ run: 0, values: [50, 5, 0.5, 0.3, 0.2, 0.2] }];
    expect(viewOf(steps, wide).autoLog).toBe(true);
    expect(viewOf(steps, wide).log).toBe(true);
    expect(viewOf(steps, wide, [], false).log).toBe(false); // the override
    const narrow = [{ run: 0, values: [11, 6, 4, 3, 3, 3] }];
    expect(viewOf(steps, narrow).log).toBe(false);
    expect(viewOf(steps, narrow, [], true).log).toBe(true);
    // a value <= 0 cannot go on a log axis: no automatic log
    expect(viewOf(steps, [{ run: 0, values: [100, 1, 0, 0.5, 0.5, 0.5] }]).autoLog).toBe(false);
    // a diverged run's values do not make the axis logarithmic: they are out of the view
    expect(viewOf(steps, [{ run: 0, values: [11, 6, 4, 3, 3, 3] }, { run: 1, values: [11, 6, 4, 3e3, 3e4, 3e5] }]).autoLog).toBe(false);
    expect(viewOf(steps, []).min).toBeNull();
  });

  it("charts loss with eval loss, gradient norm, step time and tokens/s, each under its own URL parameter", () => {
    expect(COMPARED_METRICS.map((m) => [m.key, m.evalKey, m.scaleParam])).toEqual([
      ["loss", "eval_loss", "log"],
      ["grad_norm", null, "log_grad_norm"],
      ["step_time_s", null, "log_step_time"],
      ["tokens_per_s", null, "log_tokens"],
    ]);
  });
});
