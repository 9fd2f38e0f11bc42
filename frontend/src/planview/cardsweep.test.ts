import { describe, expect, it } from "vitest";
import type { CardSweepRow, Plan } from "../types";
import { cardSweepLines } from "./cardsweep";
import { memoryBarsOf } from "./glance";

// The card sweep of Qwen3-8B at micro-batch 4 on two H200s with gpu_memory_gib: 40 (the planner's rows, rounded).
const row = (r: Partial<CardSweepRow> & Pick<CardSweepRow, "hbm_gib">): CardSweepRow => ({
  fits: true,
  step_time_s: null,
  tokens_per_s: null,
  hbm_peak_gib: null,
  policy: null,
  why_not: null,
  current: false,
  whole_card: false,
  ...r,
});
const sweep: CardSweepRow[] = [
  row({ hbm_gib: 16, fits: false, why_not: "16 GiB is too small for this job: … The smallest gpu_memory_gib that fits is 22.5 GiB" }),
  row({ hbm_gib: 24, step_time_s: 2.555, tokens_per_s: 6413, hbm_peak_gib: 21.1, policy: "sharded/gpu, keep 0, offload 0, checkpoint 36" }),
  row({ hbm_gib: 40, step_time_s: 2.555, tokens_per_s: 6413, hbm_peak_gib: 36.2, policy: "sharded/gpu, keep 5, offload 0, checkpoint 31", current: true }),
  row({ hbm_gib: 80, step_time_s: 2.5498, tokens_per_s: 6426, hbm_peak_gib: 74.7, policy: "sharded/gpu, keep 27, offload 0, checkpoint 9" }),
  row({ hbm_gib: 140.4013671875, step_time_s: 2.5278, tokens_per_s: 6482, hbm_peak_gib: 127.8, policy: "sharded/gpu, keep 36, offload 0, checkpoint 0, resident 36", whole_card: true }),
];

describe("what a different card would buy", () => {
  it("lists every size smallest first, marks the job's own row and compares the others with it", () => {
    const lines = cardSweepLines({ card_sweep: sweep });
    expect(lines.map((l) => l.size)).toEqual(["16 GiB", "24 GiB", "40 GiB", "80 GiB", "140.4 GiB (whole card)"]);
    expect(lines.map((l) => l.current)).toEqual([false, false, true, false, false]);
    const own = lines[2];
    expect(own.vsCurrent).toBeNull();
    expect(own.tokens).toBe("6,413 tokens/s");
    expect(lines[1].vsCurrent).toBe("as fast as this job");
    expect(lines[4].vsCurrent).toBe("1.1% faster than this job");
    expect(lines[4].detail).toContain("keep 36");
  });

  it("says why a size cannot hold the job instead of a policy, with no times", () => {
    const small = cardSweepLines({ card_sweep: sweep })[0];
    expect(small.fits).toBe(false);
    expect(small.step).toBe("–");
    expect(small.tokens).toBe("–");
    expect(small.vsCurrent).toBeNull();
    expect(small.detail).toContain("smallest gpu_memory_gib that fits is 22.5 GiB");
  });

  it("shows only the fit without a calibration, and nothing without a sweep", () => {
    const untimed = cardSweepLines({ card_sweep: [row({ hbm_gib: 24, policy: "sharded/gpu, keep 0, offload 0, checkpoint 36" }), row({ hbm_gib: 80, current: true, whole_card: true, policy: "sharded/gpu, keep 0, offload 0, checkpoint 36" })] });
    expect(untimed.map((l) => [l.step, l.vsCurrent, l.fits])).toEqual([["–", null, true], ["–", null, true]]);
    expect(untimed[1].size).toBe("80 GiB (whole card)");
    expect(cardSweepLines({ card_sweep: [] })).toEqual([]);
    expect(cardSweepLines({})).toEqual([]);
    expect(cardSweepLines(null)).toEqual([]);
  });
});

describe("the job's own gpu_memory_gib in the memory bars", () => {
  it("says the budget is cut from the cap, not the card, when the job sets one", () => {
    const predicted = { hbm_peak_gib: 36.2, host_ram_gib: 125.3, hbm_parts_gib: { window: 1 }, host_parts_gib: {} };
    const job = { hbm_budget_gib: 37.05, hbm_card_gib: 140.4, hbm_cap_gib: 40, hbm_budget_fraction: 0.92 };
    const [gpu] = memoryBarsOf({ predicted, job } as unknown as Plan);
    expect(gpu.note).toContain("of the job's gpu_memory_gib of 40.0 GiB (the card has 140.4 GiB)");
    const [whole] = memoryBarsOf({ predicted, job: { ...job, hbm_cap_gib: null } } as unknown as Plan);
    expect(whole.note).toContain("of the card's 140.4 GiB");
  });
});
