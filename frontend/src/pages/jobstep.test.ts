import { describe, expect, it } from "vitest";
import { measuredStepOf } from "./jobstep";
import type { MetricsRecord } from "../types";

const rec = (step: number, t: number, fwd: number, bwd: number, busy: number): MetricsRecord => ({
  step,
  step_time_s: t,
  phases: { forward: fwd, backward: bwd, update_busy: busy, update_tail: 0.1 },
});

describe("measuredStepOf", () => {
  it("takes the median of the steps so far, leaving out the first", () => {
    // step 1 pays the warm-up: 9 s; left out, the median of 3.0, 2.8 and 3.4 is 3.0
    const m = measuredStepOf([rec(1, 9, 5, 3, 1), rec(2, 3.0, 1.0, 1.8, 2.1), rec(3, 2.8, 0.9, 1.7, 2.0), rec(4, 3.4, 1.2, 1.9, 2.4)]);
    expect(m?.step_s).toBe(3.0);
    expect(m?.steps).toBe(3);
    const spans = m?.lanes.find((l) => l.key === "measured-spans");
    expect(spans?.segments.map((s) => [s.key, Number(s.s.toFixed(6))])).toEqual([
      ["forward", 1.0],
      ["backward", 1.8],
      ["after_backward", 0.2], // the step's median less the spans' medians
    ]);
    expect(m?.lanes.find((l) => l.key === "measured-busy-cpu")?.segments[0].s).toBe(2.1);
  });

  it("waits for a second timed step, and draws no lane for phases a record lacks", () => {
    expect(measuredStepOf([])).toBeNull();
    expect(measuredStepOf([rec(1, 9, 5, 3, 1)])).toBeNull();
    const m = measuredStepOf([rec(1, 9, 5, 3, 1), { step: 2, step_time_s: 2.5, phases: null }, { step: 3, step_time_s: null }]);
    expect(m).toEqual({ step_s: 2.5, steps: 1, lanes: [] });
  });
});
