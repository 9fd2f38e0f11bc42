import { describe, expect, it } from "vitest";
import { fmtByKey, runs } from "./plan";

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
