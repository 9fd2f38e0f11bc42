// The job page's step picture: the plan's one predicted step (planview/glance.ts draws it) with the run's measured
// step over it: the median of the metrics records so far, the first step left out (it pays for warm-up: allocator,
// kernels, the first deliveries). docs/interfaces.md §3 has the record's `phases` and `step_time_s`.
import { h, replace } from "../dom";
import { isNum, median } from "../fmt";
import { PHASE_TERMS } from "../glossary";
import { type MeasuredStep, onCpu, renderStep, type StepLane } from "../planview/glance";
import type { Job, MetricsRecord, Plan } from "../types";

/** The median measured step of `records` (sorted by step) leaving out the first: the step time, the compute
 *  stream's forward and backward spans and what follows them, and the time the host updater worked. Null until a
 *  second step has a time. */
export function measuredStepOf(records: readonly MetricsRecord[]): MeasuredStep | null {
  const timed = records.slice(1).filter((r) => isNum(r.step_time_s) && r.step_time_s > 0);
  if (!timed.length) return null;
  const phase = (key: string): number | null => {
    const xs = timed.map((r) => r.phases?.[key]).filter(isNum);
    return xs.length ? median(xs) : null;
  };
  const step_s = median(timed.map((r) => r.step_time_s as number));
  const lanes: StepLane[] = [];
  const fwd = phase("forward");
  const bwd = phase("backward");
  if (fwd !== null && bwd !== null) {
    const segments = [
      { key: "forward", label: "forward span", s: fwd, title: PHASE_TERMS.forward?.text },
      { key: "backward", label: "backward span", s: bwd, title: PHASE_TERMS.backward?.text },
    ];
    // what the step spends after the last backward: the host update's tail, the wait for the next batches
    const rest = step_s - fwd - bwd;
    if (rest > 1e-3) segments.push({ key: "after_backward", label: "after the backward", s: rest, title: "The rest of the measured step: the wait for the host update to finish and for the next step's batches." });
    lanes.push({ key: "measured-spans", label: "measured", segments });
  }
  const busy = phase("update_busy");
  if (busy !== null && busy > 1e-6) lanes.push({ key: "measured-busy-cpu", label: "CPU update (measured)", segments: [{ key: "update_busy", label: "busy", s: busy, title: PHASE_TERMS.update_busy?.text }] });
  return { step_s, steps: timed.length, lanes };
}

/** The section: call update(job, records) whenever the job or its metrics change. */
export function stepPicture(): { el: HTMLElement; update: (job: Job | null, records: readonly MetricsRecord[]) => void } {
  const body = h("div", null, h("p", { class: "muted" }, "The step picture appears once the job has a plan with times or a second step."));
  const el = h("section", { class: "job-step", "aria-labelledby": "job-step-h" }, h("h2", { id: "job-step-h" }, "One step: planned and measured"), body);
  let shown = "";
  return {
    el,
    update(job, records) {
      const measured = measuredStepOf(records);
      const plan = job?.policy ?? null;
      const key = JSON.stringify([measured, plan?.predicted ?? null]);
      if (key === shown) return; // redrawn only when a figure changed
      shown = key;
      const picture = renderStep(plan ?? ({ predicted: null } as Plan), measured, jobOnCpu(job));
      if (picture) replace(body, picture);
    },
  };
}

/** Whether the job trains on the CPU: its config's `gpus` is 0, or its plan says so (`job.on_gpu`). */
export function jobOnCpu(job: Pick<Job, "config" | "policy"> | null): boolean {
  if (!job) return false;
  return job.config?.gpus === 0 || (job.policy ? onCpu(job.policy) : false);
}
