import { describe, expect, it } from "vitest";
import { STAGE_TERMS } from "./glossary";
import { divergence, stageAhead, stageHeadline, stageHint, stageProgress, startingStage, startupSummary, startupText, tenths } from "./stage";

describe("start-up stages", () => {
  it("says where a job is until its first step, and nothing once it trains or ended", () => {
    expect(startingStage({ status: "queued", stage: null }, false)).toEqual({ stage: "queued" });
    // a resumed job waiting again: the queue, whatever the last attempt reported
    expect(startingStage({ status: "queued", stage: { stage: "training" } }, true)).toEqual({ stage: "queued" });
    expect(startingStage({ status: "running", stage: null }, false)).toEqual({ stage: "launching" });
    expect(startingStage({ status: "running", stage: null }, true)).toBeNull();
    const planning = { stage: "planning", elapsed_s: 0.01 };
    expect(startingStage({ status: "running", stage: planning }, true)).toBe(planning);
    expect(startingStage({ status: "running", stage: { stage: "training", durations: {} } }, false)).toBeNull();
    expect(startingStage({ status: "failed", stage: planning }, false)).toBeNull();
  });

  it("puts each stage in words, with the units of the host state while it fills", () => {
    expect(stageHeadline({ stage: "queued" })).toBe("Queued — waiting for the worker");
    expect(stageHeadline({ stage: "preparing", elapsed_s: 0 })).toBe("Preparing (loading the runtime)");
    expect(stageHeadline({ stage: "calibrating" })).toBe("Calibrating this host (cached for the next runs)");
    expect(stageHeadline({ stage: "building_host_state", done: 12, total: 38, progress: 12 / 38 })).toBe(
      "Building the host state — 12 of 38 units",
    );
    expect(stageHeadline({ stage: "building_host_state" })).toBe("Building the host state");
    expect(stageHeadline({ stage: "starting_ranks" })).toBe("Starting the rank processes");
    expect(stageHeadline({ stage: "first_step" })).toBe("Running the first step");
    expect(stageHeadline({ stage: "warming_caches" })).toBe("Warming caches");
    expect(stageHint("planning")).toBe(STAGE_TERMS.planning.text);
    expect(stageHint("launching")).toBeTruthy();
    expect(stageProgress({ stage: "loading_weights", done: 3, total: 4 })).toBe(0.75);
    expect(stageProgress({ stage: "loading_weights", progress: 1.2 })).toBe(1);
    expect(stageProgress({ stage: "planning" })).toBeNull();
  });

  it("tells a later report of the same start from an earlier one", () => {
    const prep = { stage: "preparing", elapsed_s: 0 };
    const plan = { stage: "planning", elapsed_s: 0 };
    const fill = (done: number, t: number) => ({ stage: "loading_weights", done, total: 38, elapsed_s: t });
    expect(stageAhead(plan, prep)).toBe(true);
    expect(stageAhead(prep, plan)).toBe(false);
    expect(stageAhead(fill(20, 3.5), fill(12, 3))).toBe(true);
    expect(stageAhead(fill(12, 3), fill(12, 3))).toBe(false);
    expect(stageAhead({ stage: "training", durations: {} }, { stage: "first_step", elapsed_s: 9 })).toBe(true);
    expect(stageAhead(prep, null)).toBe(true);
    expect(stageAhead(null, prep)).toBe(false);
  });

  it("sums up the start once the job trains, stages in the order they ran", () => {
    const s = {
      stage: "training",
      durations: { planning: 0.412, building_host_state: 3.08, starting_ranks: 5.0, first_step: 3.79 },
      total_s: 12.31,
    };
    const sum = startupSummary(s);
    expect(sum?.parts.map((p) => p.stage)).toEqual(["planning", "building_host_state", "starting_ranks", "first_step"]);
    expect(sum?.parts[1].hint).toBe(STAGE_TERMS.building_host_state.text);
    expect(startupText(sum!)).toBe("Start-up: 12.3 s (planning 0.4 s, host state 3.1 s, ranks 5.0 s, first step 3.8 s)");
    expect(startupSummary({ stage: "planning" })).toBeNull();
    expect(startupSummary(null)).toBeNull();
    expect(startupSummary({ stage: "training", durations: { loading_weights: 1, odd_stage: 2 } })?.parts.map((p) => p.label)).toEqual([
      "loading weights",
      "odd stage",
    ]);
    expect(tenths(0.04)).toBe("0.0 s");
    expect(tenths(150)).toBe("2 min 30 s");
  });
});

describe("divergence", () => {
  it("reads the step and the reason of a diverged run", () => {
    expect(divergence({ message: "diverged: loss is NaN at step 2" })).toEqual({ step: 2, reason: "loss is NaN", dead: false, text: "Diverged at step 2: loss is NaN" });
    expect(divergence({ message: "diverged: gradient norm is +inf at step 17" })?.text).toBe("Diverged at step 17: gradient norm is +inf");
    const dead = divergence({ message: "diverged: the gradient norm is exactly 0 for 3 steps in a row (steps 4-6), so nothing is learning, at step 4" });
    expect(dead).toEqual({ step: 4, dead: true, reason: "the gradient norm is exactly 0 for 3 steps in a row (steps 4-6), so nothing is learning", text: "Diverged at step 4: the gradient norm is exactly 0 for 3 steps in a row (steps 4-6), so nothing is learning" });
    expect(divergence({ message: "diverged: gradient norm is +inf at step 17" })?.dead).toBe(false);
    expect(divergence({ message: "diverged: loss is NaN" })?.text).toBe("Diverged: loss is NaN");
    expect(divergence({ message: "stopped by health.on_warning: loss 7 at step 3 ..." })).toBeNull();
    expect(divergence({ message: "the job's process died with signal 9" })).toBeNull();
    expect(divergence(null)).toBeNull();
  });
});
