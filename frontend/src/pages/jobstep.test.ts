import { describe, expect, it } from "vitest";
import { jobOnCpu, measuredStepOf } from "./jobstep";
import planBs8 from "../fixtures/plan-8b-bs8.json";
import { bindingOf, stepLanesOf } from "../planview/glance";
import type { Job, MetricsRecord, Plan } from "../types";

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

describe("the step picture's words fit the machine", () => {
  const gpuPlan = planBs8 as unknown as Plan;
  // the same prediction as planned for a CPU job (gpus = 0): the planner says so in job.on_gpu
  const cpuPlan: Plan = { ...gpuPlan, job: { ...gpuPlan.job, on_gpu: false } };
  const labels = (plan: Plan, cpu?: boolean) => stepLanesOf(plan, cpu)!.lanes.map((l) => l.label);

  it("names the compute stream and its busy lane after the CPU on a CPU job, after the GPU on a GPU job", () => {
    expect(labels(gpuPlan)).toContain("GPU stream");
    expect(labels(gpuPlan)).toContain("GPU compute");
    const cpu = labels(cpuPlan);
    expect(cpu[0]).toBe("CPU compute");
    expect(cpu.filter((l) => /GPU/.test(l) && !/→|collectives/.test(l))).toEqual([]);
    expect(cpu).toContain("CPU update");
    // told outright (a job page whose plan lacks job.on_gpu)
    expect(labels(gpuPlan, true)[0]).toBe("CPU compute");
  });

  it("knows a CPU job from its config or its plan", () => {
    const job = (config: Record<string, unknown>, policy: Plan | null = null) => ({ config, policy }) as Pick<Job, "config" | "policy">;
    expect(jobOnCpu(job({ gpus: 0 }))).toBe(true);
    expect(jobOnCpu(job({ gpus: 2 }))).toBe(false);
    expect(jobOnCpu(job({}, cpuPlan))).toBe(true);
    expect(jobOnCpu(job({ gpus: 1 }, gpuPlan))).toBe(false);
    expect(jobOnCpu(null)).toBe(false);
  });

  it("says CPU compute where a CPU job's step is bound by compute", () => {
    const bound = (plan: Plan): Plan => ({ ...plan, predicted: { ...plan.predicted!, bound: { binding: "compute", terms_s: { compute: 1.5 } } } });
    expect(bindingOf(bound(cpuPlan))).toBe("CPU compute: 1.5 s of work per step");
    expect(bindingOf(bound(gpuPlan))).toBe("GPU compute: 1.5 s of work per step");
  });
});
