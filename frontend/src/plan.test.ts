import { describe, expect, it } from "vitest";
import { fmtByKey, readPlan, runs, type PlanAnswer } from "./plan";
import type { ExecutionPolicy, Plan } from "./types";
import planBs4 from "./fixtures/plan-8b-bs4.json";
import planBs8 from "./fixtures/plan-8b-bs8.json";
import { TIE_RULE, activationWords, alternativesOf, differenceWords, foldKey, gibs, headroom, memoryBarsOf, pct, secs, stepLanesOf, verdictOf } from "./planview/glance";

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
    expect(fmtByKey("exposed_s", { h2d: 4.44e-16, cpu: 0.9 })).toBe("h2d 0 ms, cpu 900 ms");
    expect(fmtByKey("hbm_parts_gib", { window: 1e-12 })).toBe("window 0 GiB");
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
    // after the run: its steady steps against the prediction, in its own words and not among the details
    const message = "steps 3-10: median step 1.170 s, predicted 1.000 s (-14.5%); measured / predicted: host update busy 0.650 / 0.500 s (1.30x)";
    const checked = readPlan({ ...planned, stage: "resolved", prediction_check: { message, prediction_error: -0.145 } });
    expect(checked.checked).toBe(message);
    expect(checked.details).not.toHaveProperty("prediction_check");
    expect(readPlan({ ...planned, stage: "planned", prediction_check: { message, prediction_error: -0.145 } }).checked).toBeNull();
    expect(atSubmit.checked).toBeNull();
  });
});

// The plan at a glance, on plans AutoPolicy made from the nvidia-h200-x2 fixture calibrations
// (tests/runtime/fixtures/h200x2_*.json): qwen3-8b on two GPUs, sequence 2048, micro-batch 4 and 8.
describe("the plan at a glance", () => {
  const bs4 = planBs4 as unknown as Plan;
  const bs8 = planBs8 as unknown as Plan;

  it("says the verdict in words, with units and headroom", () => {
    const v = verdictOf(bs8);
    expect(v?.policy).toBe("Replicated delivery, GPU reduction; 23 layers keep activations, the rest recompute; embedding/head updated on the host");
    expect(v?.step).toBe("2.83 s per step, 11,579 tokens/s");
    expect(v?.hbm?.text).toBe("127.8 of 129.2 GiB per GPU — 1.0% free");
    expect(v?.host?.text).toBe("125.3 of 256.0 GiB host RAM — 51% free");
    expect(v?.binds).toBe("the CPU update (AdamW on the host): 2.2 s of work per step; this policy's physical floor is 2.39 s per step");
    expect(v?.change).toBe("a faster CPU update (AdamW on the host): 902 ms of the 2.83 s step (32%) waits on it");
    const v4 = verdictOf(bs4);
    expect(v4?.policy).toBe("Sharded delivery, GPU reduction; all 36 layers keep activations; embedding/head updated on the host");
    expect(v4?.hbm?.text).toBe("107.8 of 129.2 GiB per GPU — 17% free");
    // No figure is invented: a plan without times has no step, binding or change.
    const untimed = verdictOf({ ...bs8, predicted: { ...bs8.predicted!, step_time_s: null, tokens_per_s: null, exposed: {}, bound: undefined } });
    expect([untimed?.step, untimed?.binds, untimed?.change]).toEqual([null, null, null]);
    expect(verdictOf({ ...bs8, policy: null })).toBeNull();
  });

  it("warns below 5% headroom, and only there", () => {
    expect(verdictOf(bs8)?.warnings).toHaveLength(1);
    expect(verdictOf(bs8)?.warnings[0]).toBe("GPU memory: only 1.0% free (127.8 of 129.2 GiB per GPU), under the 5% margin: an error in the memory prediction could run the job out of memory.");
    expect(verdictOf(bs4)?.warnings).toEqual([]);
    expect(headroom(122.7, 129.2, "per GPU")?.low).toBe(false); // 5.03% free
    expect(headroom(123.0, 129.2, "per GPU")?.low).toBe(true); // 4.80% free
    expect(headroom(130.2, 129.2, "per GPU")?.text).toBe("130.2 of 129.2 GiB per GPU — 1 GiB over");
    expect(memoryBarsOf(bs8).map((b) => b.room?.low)).toEqual([true, false]);
  });

  it("lists the alternatives: the chosen row first among fitting rows, then by predicted time, rejected last with why", () => {
    for (const plan of [bs4, bs8]) {
      const rows = alternativesOf(plan);
      const fitting = rows.filter((r) => r.fits);
      expect(fitting[0].chosen).toBe(true);
      expect(rows.filter((r) => r.chosen)).toHaveLength(1);
      expect(fitting[0].step_s).toBe(plan.predicted?.step_time_s);
      // every fitting row after the chosen one is slower, or faster only within the tie rule, which it then says
      for (const r of fitting.slice(1)) {
        expect(r.vsChosen).not.toBeNull();
        if ((r.vsChosen as number) < 0) {
          expect(-(r.vsChosen as number)).toBeLessThan(TIE_RULE);
          expect(r.note).toMatch(/within the 0\.1% .* defaults kept$/);
        } else expect(r.note).toBeNull();
      }
      const rest = fitting.slice(1).filter((r) => !r.note);
      expect(rest.map((r) => r.step_s)).toEqual([...rest.map((r) => r.step_s)].sort((a, b) => (a as number) - (b as number)));
      const firstRejected = rows.findIndex((r) => !r.fits);
      if (firstRejected >= 0) expect(rows.slice(firstRejected).every((r) => !r.fits)).toBe(true);
      // one row per route × activation mix × update placement; every candidate is in exactly one row
      expect(new Set(rows.map((r) => foldKey(r.policy))).size).toBe(rows.length);
      expect(rows.reduce((n, r) => n + 1 + r.variants.length, 0)).toBe(plan.candidates.length);
    }
  });

  it("folds window, chunk, loss chunk and resident variants into their row", () => {
    const rows = alternativesOf(bs8);
    const chosen = rows.find((r) => r.chosen)!;
    // windows 3, 4 and 6 at the default loss chunk, and windows 2 to 6 with a loss chunk of 8192 (fewer resident
    // layers): the same route, the same 23 keep / 13 recompute, the same update placement
    expect(chosen.variants).toHaveLength(7);
    expect(chosen.variants.every((c) => c.predicted.step_time_s! > chosen.step_s!)).toBe(true);
    expect(new Set(chosen.variants.map((c) => c.policy.loss_chunk_tokens))).toEqual(new Set([4096, 8192]));
    expect(alternativesOf(bs4).find((r) => r.chosen)?.variants).toHaveLength(15);
    const big = chosen.variants.find((c) => c.policy.loss_chunk_tokens === 8192 && c.policy.window === 2)!;
    expect(differenceWords(big.policy, chosen.policy)).toBe("loss chunk 8192, 11 of 36 layers resident");
    expect(rows.map((r) => r.text)).toContain("Sharded delivery, host reduction; 27 layers keep activations, the rest recompute; embedding/head updated on the host");
    expect(rows.find((r) => r.note)?.vsChosen).toBeCloseTo(-0.000739, 5);
    expect(pct(-rows.find((r) => r.note)!.vsChosen!)).toBe("0.07%");
  });

  it("gives rejected rows their reason in words", () => {
    const rejected = alternativesOf(bs8).filter((r) => !r.fits);
    expect(rejected).toHaveLength(1);
    expect(rejected[0].text).toMatch(/all 36 layers keep activations/);
    expect(rejected[0].reason).toBe("Not taken: it needs 173.3 GiB of HBM per GPU, 44.2 GiB over the budget of 129.2 GiB.");
    expect(rejected[0].hbmFree).toBeLessThan(0);
    for (const r of alternativesOf(bs8)) expect(r.fits ? r.reason === null : !!r.reason).toBe(true);
  });

  it("draws memory per GPU and for the host by part, the parts adding up to the plan's total", () => {
    for (const plan of [bs4, bs8]) {
      const [hbm, host] = memoryBarsOf(plan);
      expect(hbm.title).toBe("GPU memory, per GPU");
      expect(hbm.total).toBe(plan.predicted?.hbm_peak_gib);
      expect(hbm.parts.reduce((s, p) => s + p.gib, 0)).toBeCloseTo(plan.predicted!.hbm_peak_gib!, 6);
      expect(host.total).toBe(plan.predicted?.host_ram_gib);
      expect(host.parts.reduce((s, p) => s + p.gib, 0)).toBeCloseTo(plan.predicted!.host_ram_gib, 6);
      expect(hbm.limit).toBe(plan.job?.hbm_budget_gib);
      expect(host.limit).toBe(256);
      // zero parts are left out, the others named in words
      expect(hbm.parts.every((p) => p.gib > 0)).toBe(true);
      expect(hbm.parts.map((p) => p.label)).toContain("activations");
      expect(host.parts.map((p) => p.label)).toContain("fp32 master weights and AdamW moments");
      // why the budget is below the card's size, from the plan's own figures
      expect(hbm.note).toBe(
        "Per GPU: each GPU holds its own copy of these parts. The budget is 129.2 GiB (92%) of the card's 140.4 GiB: the other 11.2 GiB is left for the CUDA context, NCCL and fragmentation. Each part includes 10% for the caching allocator's rounding.",
      );
    }
  });

  it("draws one step: the GPU stream's phases and the spans each add up to the step", () => {
    for (const plan of [bs4, bs8]) {
      const step = stepLanesOf(plan)!;
      expect(step.step_s).toBe(plan.predicted?.step_time_s);
      for (const key of ["phases", "spans"]) {
        const lane = step.lanes.find((l) => l.key === key)!;
        expect(lane.segments.reduce((s, x) => s + x.s, 0)).toBeCloseTo(step.step_s, 6);
      }
      expect(step.lanes.find((l) => l.key === "phases")!.segments.map((x) => x.key)).toEqual(["forward", "backward", "update_tail", "delivery_wait"]);
      expect(step.lanes.find((l) => l.key === "busy-cpu")?.label).toBe("CPU update");
    }
    expect(stepLanesOf({ ...bs8, predicted: { ...bs8.predicted!, step_time_s: null } })).toBeNull();
  });

  it("formats without float noise", () => {
    expect(secs(4.44e-16)).toBe("0 ms");
    expect(secs(0.902)).toBe("902 ms");
    expect(gibs(1e-9)).toBe("0 GiB");
    expect(gibs(2.5502)).toBe("2.55 GiB");
    expect(gibs(127.8499)).toBe("127.8 GiB");
    expect(pct(0.0000001)).toBe("0%");
    expect(pct(0.2413)).toBe("24%");
    expect(activationWords(["keep", "offload", "checkpoint", "checkpoint"])).toBe("1 layer keeps activations, 1 layer offloads them to host memory, 2 layers recompute");
  });
});
