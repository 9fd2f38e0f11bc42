import { describe, expect, it } from "vitest";
import { fmtByKey, readPlan, runs, type PlanAnswer } from "./plan";
import type { ExecutionPolicy, Plan } from "./types";

describe("plan values", () => {
  it("reads per-unit lists as runs", () => {
    expect(runs(["checkpoint", "checkpoint", "checkpoint", "keep", "keep", "offload"])).toBe("checkpoint ×3, keep ×2, offload");
    expect(runs(["a", "b"])).toBe("a, b");
  });

  it("formats by what the key names", () => {
    expect(fmtByKey("step_time_s", 1.234)).toBe("1.23 s");
    expect(fmtByKey("host_state_bytes", 12864768)).toBe("12.3 MiB");
    expect(fmtByKey("hbm_peak_gib", 39.5)).toBe("39.5 GiB");
    expect(fmtByKey("fits", false)).toBe("no");
    expect(fmtByKey("resident", [false, false, false, false])).toBe("no ×4");
    expect(fmtByKey("exposure", { h2d_s: 0.1, cpu_s: 0.25 })).toBe("h2d 100 ms, cpu 250 ms");
    expect(fmtByKey("exposed_s", { h2d: 0.1, cpu: 2 })).toBe("h2d 100 ms, cpu 2 s");
    expect(fmtByKey("validation", [])).toBe("none");
  });
});

// Plan JSON as slidedp.planning.autopolicy.plan_job writes it (docs/interfaces.md §5), for four decoder layers
// on two GPUs, as POST /api/plan answers it (with host and validation).
const sharded: ExecutionPolicy = {
  delivery: "sharded",
  grad_reduce: "gpu",
  delivery_cast: "host",
  edge_update: "host",
  device_layers: 0,
  activations: ["keep", "checkpoint", "checkpoint", "checkpoint"],
  resident: [true, false, false, false],
  window: 2,
  chunk_mb: 64,
  loss_chunk_tokens: 4096,
  staging_slots: 8,
};
const replicated: ExecutionPolicy = { ...sharded, delivery: "replicated", grad_reduce: "host" };
const predicted = (step: number) => ({
  step_time_s: step,
  tokens_per_s: 32768 / step,
  phases: { data: 0, forward: 0.5, backward: step - 0.6, update_tail: 0.05, delivery_wait: 0.05 },
  spans: { forward: 0.6, backward: step - 0.6 },
  exposed: { h2d: 0, d2h: 0.05, collective: 0, cpu_update: 0.9, recompute: 0, host_dram: 0 },
  busy: { compute: 1.8, h2d: 0.4, d2h: 0.4, coll: 0.04, cpu: 2.2 },
  hbm_peak_gib: 40.5,
  host_ram_gib: 120.0,
  hbm_parts_gib: { window: 0.8 },
  host_parts_gib: { master_and_moments: 91.5 },
});
const planned: Plan = {
  feasible: true,
  policy: sharded,
  predicted: predicted(2.5),
  candidates: [
    { policy: sharded, predicted: predicted(2.5), fits: true, why_not: null },
    { policy: replicated, predicted: predicted(3.1), fits: true, why_not: null },
  ],
  marginal: { k_bytes: 3.5e9, tau_0_s: 0.08, delta_s: { keep: -0.001, offload: 0.036 }, tau_s: { checkpoint: 0.08, keep: 0.079 }, T_s_per_GB: {} },
  why: "Routes (NVLink with P2P): sharded delivery, gpu gradient reduction, by predicted step time.",
  errors: [],
  calibration: "measured",
  calibration_note: "measured on this host",
  host_update: { threads: 16, s_per_1e9: 0.4 },
  job: { world: 2, layers: 4, hbm_budget_gib: 129.2, host_limit_gib: 256.0, host_limit_source: "cgroup" },
  host: "gpu-host",
  validation: [],
};

describe("readPlan", () => {
  it("shows the plan's policy, its prediction, memory fit and candidates", () => {
    const v = readPlan(planned);
    expect(v.asRun).toBe(false);
    expect(v.feasible).toBe(true);
    expect(v.policy).toEqual(sharded);
    expect(v.why).toBe(planned.why);
    expect(v.problems).toEqual([]);
    expect(v.prediction).toMatchObject({ step_time_s: 2.5, phases_s: planned.predicted?.phases, spans_s: planned.predicted?.spans });
    expect(v.prediction).not.toHaveProperty("hbm_peak_gib");
    expect(v.memory).toEqual({
      fits: true,
      hbm_peak_gib: 40.5,
      hbm_budget_gib: 129.2,
      host_ram_gib: 120.0,
      host_limit_gib: 256.0,
      host_limit_source: "cgroup",
      hbm_parts_gib: { window: 0.8 },
      host_parts_gib: { master_and_moments: 91.5 },
    });
    expect(v.candidates.map((r) => [r.delivery, r.step_time_s, r.fits])).toEqual([
      ["sharded", 2.5, true],
      ["replicated", 3.1, true],
    ]);
    expect(v.chosen).toEqual([true, false]);
    expect(v.marginal?.rows.map((r) => r.policy)).toEqual(["checkpoint", "keep", "offload"]);
    // What has no place of its own is listed by name; empty entries are not.
    expect(Object.keys(v.details).sort()).toEqual(["calibration", "calibration_note", "host", "host_update", "job"]);
  });

  it("reads a refusal: the problems, no policy, no prediction", () => {
    const refused: Plan = {
      feasible: false,
      policy: null,
      predicted: null,
      candidates: [],
      marginal: null,
      why: "not feasible: host_ram_gib: host RAM too small",
      errors: [{ loc: "host_ram_gib", msg: "host RAM too small: the job needs 215.7 GiB" }],
      calibration: "missing",
      job: { world: 2, host_limit_gib: 180.0 },
    };
    const v = readPlan(refused);
    expect(v.feasible).toBe(false);
    expect(v.policy).toBeNull();
    expect(v.prediction).toBeNull();
    expect(v.problems).toEqual(["host_ram_gib: host RAM too small: the job needs 215.7 GiB"]);
    expect(v.memory).toEqual({ fits: false, host_limit_gib: 180.0 });
    expect(v.candidates).toEqual([]);
    expect(v.marginal).toBeNull();
  });

  it("reads a preview with blocking problems and warnings: they come first, and it is never feasible", () => {
    const missing = { loc: "data.path", msg: "dataset file /srv/gone.jsonl does not exist" };
    const headroom = { loc: "host_ram_gib", msg: "little headroom: the plan's host RAM is 120.0 GiB of the 128.0 GiB" };
    const preview: PlanAnswer = { ...planned, problems: [missing], warnings: [headroom], feasible: false, fits: true, validation: [missing] };
    const v = readPlan(preview);
    expect(v.blocked).toBe(true);
    expect(v.feasible).toBe(false);
    expect(v.problems).toEqual(["data.path: dataset file /srv/gone.jsonl does not exist"]);
    expect(v.warnings).toEqual([`host_ram_gib: ${headroom.msg}`]);
    expect(v.memory?.fits).toBe(true); // the plan itself fits: only the job's problems block it
    expect(v.policy).toEqual(sharded);
    expect(Object.keys(v.details)).not.toContain("validation");
    // Even an answer that says feasible is not shown so while something blocks the job.
    expect(readPlan({ ...preview, feasible: true }).feasible).toBe(false);
    // The planner's own refusal on the host is said once, after the job's problems.
    const gpus = { loc: "gpus", msg: "asks for 8 GPUs but this host has 2" };
    const refused = readPlan({ ...preview, problems: [missing, gpus], errors: [gpus], fits: false });
    expect(refused.problems).toEqual([`data.path: ${missing.msg}`, `gpus: ${gpus.msg}`]);
    expect(refused.memory?.fits).toBe(false);
    // Nothing blocks it: feasible as the plan says, no warnings.
    const clean = readPlan({ ...planned, problems: [], warnings: [], fits: true });
    expect([clean.blocked, clean.feasible, clean.warnings]).toEqual([false, true, []]);
  });

  it("reads a job's policy column: the plan made at submit time, then the policy that ran", () => {
    const atSubmit = readPlan({ ...planned, stage: "planned" });
    expect(atSubmit.asRun).toBe(false);
    expect(atSubmit.details).not.toHaveProperty("stage");
    const ran: ExecutionPolicy = { ...sharded, window: 3, staging_slots: 8 };
    const v = readPlan({ ...planned, stage: "resolved", policy: ran });
    expect(v.asRun).toBe(true);
    expect(v.policy).toEqual(ran);
    expect(v.chosen).toEqual([false, false]); // the engine ran none of the submit-time candidates
    expect(readPlan({ ...planned, stage: "resolved" }).chosen).toEqual([true, false]);
  });
});
