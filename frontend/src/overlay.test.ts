import { describe, expect, it } from "vitest";
import { compareHref, MAX_COMPARED, overlay, parseSelection, resumeSteps } from "./overlay";
import { MetricsStore } from "./series";
import type { MetricsRecord } from "./types";

const run = (steps: number[], loss: (s: number) => number | null = (s) => 10 - s): MetricsRecord[] =>
  steps.map((step) => ({ step, loss: loss(step) }));

describe("parseSelection", () => {
  it("reads the job ids in the order given, each once, and the log axis", () => {
    expect(parseSelection("?ids=5,3,5,12&log=1")).toEqual({ ids: [5, 3, 12], problems: [], scales: { log: true } });
    expect(parseSelection("?ids=%207%20,,8")).toEqual({ ids: [7, 8], problems: [], scales: {} });
    // an explicit linear choice is kept too (it overrides the automatic log axis); other values choose nothing
    expect(parseSelection("?ids=1&log=0&log_grad_norm=1&log_tokens=yes").scales).toEqual({ log: false, log_grad_norm: true });
  });

  it("names what is not a job id instead of dropping it silently", () => {
    const sel = parseSelection("?ids=3,abc,0,-2,1.5,99999999999999999999");
    expect(sel.ids).toEqual([3]);
    expect(sel.problems).toEqual([
      '"abc" is not a job id (a whole number from 1).',
      '"0" is not a job id (a whole number from 1).',
      '"-2" is not a job id (a whole number from 1).',
      '"1.5" is not a job id (a whole number from 1).',
      '"99999999999999999999" is not a job id (a whole number from 1).',
    ]);
  });

  it("reads no ids from a URL without them, and keeps at most MAX_COMPARED", () => {
    expect(parseSelection("")).toEqual({ ids: [], problems: [], scales: {} });
    const many = Array.from({ length: MAX_COMPARED + 2 }, (_, i) => i + 1);
    const sel = parseSelection(`?ids=${many.join(",")}`);
    expect(sel.ids).toEqual(many.slice(0, MAX_COMPARED));
    expect(sel.problems).toEqual([`At most ${MAX_COMPARED} jobs are compared at once: jobs #11, #12 are left out.`]);
  });

  it("round-trips through the URL it builds", () => {
    expect(compareHref([4, 2], { log: true })).toBe("/jobs/compare?ids=4,2&log=1");
    expect(parseSelection(compareHref([4, 2], { log: true }).split("?")[1])).toEqual({ ids: [4, 2], problems: [], scales: { log: true } });
    const both = { log: false, log_step_time: true };
    expect(parseSelection(compareHref([4], both).split("?")[1]).scales).toEqual(both);
    expect(compareHref([9])).toBe("/jobs/compare?ids=9");
  });
});

describe("resumeSteps", () => {
  it("marks where a later attempt's first record follows earlier steps", () => {
    // attempt 1 ran steps 1..6 and checkpointed at 4; attempt 2 resumed at 5 and its records replaced 5 and 6
    const store = new MetricsStore();
    store.addMany(run([1, 2, 3, 4, 5, 6]).map((r) => (r.step === 1 ? { ...r, startup_s: { planning: 0.1 } } : r)));
    store.addMany([5, 6, 7, 8].map((step) => ({ step, loss: 1, ...(step === 5 ? { startup_s: { loading_checkpoint: 0.2 } } : {}) })));
    expect(store.records.map((r) => r.step)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(resumeSteps(store.records)).toEqual([5]);
  });

  it("does not mark a run's own first step, nor a job that never resumed", () => {
    expect(resumeSteps([{ step: 1, startup_s: { planning: 1 } }, { step: 2 }])).toEqual([]);
    expect(resumeSteps(run([1, 2, 3]))).toEqual([]);
    expect(resumeSteps([])).toEqual([]);
  });
});

describe("overlay", () => {
  it("puts jobs of different lengths on one shared step axis", () => {
    const o = overlay([run([1, 2, 3]), run([1, 2, 3, 4, 5], (s) => s / 10)]);
    expect(o.steps).toEqual([1, 2, 3, 4, 5]);
    expect(o.values[0]).toEqual([9, 8, 7, null, null]);
    expect(o.values[1]).toEqual([0.1, 0.2, 0.3, 0.4, 0.5]);
    expect(o.last).toEqual([{ step: 3, value: 7 }, { step: 5, value: 0.5 }]);
  });

  it("keeps eval loss only at the steps that evaluated, and says which jobs evaluated", () => {
    const a = run([1, 2, 3, 4]).map((r) => (r.step % 2 === 0 ? { ...r, eval_loss: r.step } : r));
    const o = overlay([a, run([1, 2])]);
    expect(o.evalValues[0]).toEqual([null, 2, null, 4]);
    expect(o.evalValues[1]).toEqual([null, null, null, null]);
    expect(o.hasEval).toEqual([true, false]);
  });

  it("draws a non-finite loss as a gap, and a value a log axis cannot place as one too", () => {
    const recs: MetricsRecord[] = [{ step: 1, loss: 2 }, { step: 2, loss: null }, { step: 3, loss: NaN }, { step: 4, loss: 0 }, { step: 5, loss: 1 }];
    expect(overlay([recs]).values[0]).toEqual([2, null, null, 0, 1]);
    expect(overlay([recs], { log: true }).values[0]).toEqual([2, null, null, null, 1]);
    expect(overlay([recs]).last[0]).toEqual({ step: 5, value: 1 });
  });

  it("draws a resumed job as one line with its resume step", () => {
    const recs = run([1, 2, 3, 4, 5, 6]).map((r) => (r.step === 1 || r.step === 4 ? { ...r, startup_s: {} } : r));
    const o = overlay([recs, run([1, 2, 3, 4, 5, 6])]);
    expect(o.values[0]).toEqual([9, 8, 7, 6, 5, 4]);
    expect(o.resumes).toEqual([[4], []]);
  });

  it("downsamples a long axis but keeps every eval step and resume step, and the newest step", () => {
    const long = Array.from({ length: 5000 }, (_, i) => {
      const step = i + 1;
      const r: MetricsRecord = { step, loss: 5 + Math.sin(step) };
      if (step % 500 === 0) r.eval_loss = 4;
      if (step === 2345) r.startup_s = {};
      return r;
    });
    const o = overlay([long, run([1, 2, 3])], { maxPoints: 400 });
    expect(o.steps.length).toBeLessThan(800);
    expect(o.steps[o.steps.length - 1]).toBe(5000);
    for (let s = 500; s <= 5000; s += 500) expect(o.steps).toContain(s);
    expect(o.steps).toContain(2345);
    expect(o.resumes[0]).toEqual([2345]);
    // the columns stay aligned with the drawn steps
    const i = o.steps.indexOf(2345);
    expect(o.values[0][i]).toBe(5 + Math.sin(2345));
    expect(o.evalValues[0][o.steps.indexOf(1000)]).toBe(4);
    // the short job keeps its first and last step (its extremes), each with its own value
    expect(o.values[1].slice(0, 2)).toEqual([9, 7]);
    expect(o.steps.slice(0, 2)).toEqual([1, 3]);
    expect(o.values[1].slice(2).every((v) => v === null)).toBe(true);
  });
});
