import { describe, expect, it } from "vitest";
import { axisNum, bytes, duration, grouped, jobClock, num, sci, seconds, secondsBetween } from "./fmt";

describe("formatting", () => {
  it("says NaN and infinities instead of hiding them", () => {
    expect(num(NaN)).toBe("NaN");
    expect(num(Infinity)).toBe("+Inf");
    expect(num(undefined)).toBe("–");
  });
  it("formats magnitudes readably", () => {
    expect(num(12345.6)).toBe("12,346");
    expect(num(0.000012)).toBe("1.20e-5");
    expect(num(2.34567, 3)).toBe("2.35");
    expect(seconds(0.0123)).toBe("12.3 ms");
    expect(seconds(1.5)).toBe("1.5 s");
    expect(duration(3725)).toBe("1 h 02 min");
    expect(duration(42)).toBe("42 s");
    expect(bytes(3 * 1024 ** 3)).toBe("3 GiB");
  });

  it("keeps axis tick labels short", () => {
    expect([0, 0.5, 12000, 2_500_000, 0.00012, 3e10].map(axisNum)).toEqual(["0", "0.5", "12k", "2.5M", "1.2e-4", "3.0e+10"]);
  });

  it("reads seconds in ms below a second, never with an exponent", () => {
    expect(seconds(1.55e-4)).toBe("0.155 ms");
    expect(seconds(3.4e-5)).toBe("0.034 ms");
    expect(seconds(0.00155)).toBe("1.55 ms");
    expect(seconds(0.5573)).toBe("557 ms");
    expect(seconds(0.9996)).toBe("1 s");
    expect(seconds(3.41)).toBe("3.41 s");
    expect(seconds(0)).toBe("0 ms");
    expect(seconds(2e-10)).toBe("< 0.001 ms");
    expect(seconds(300)).toBe("5 min 00 s");
    expect(seconds(NaN)).toBe("–");
    for (const v of [1e-9, 1.23e-7, 4.5e-6, 1.550e-4, 0.0099, 0.099]) expect(seconds(v)).not.toMatch(/e[-+]/);
  });

  it("writes a learning rate as people do", () => {
    expect([3e-4, 2.5e-5, 0.003, 1e-6, 0].map(sci)).toEqual(["3e-4", "2.5e-5", "0.003", "1e-6", "0"]);
  });

  it("groups thousands in rates and counts", () => {
    expect(grouped(29440.9)).toBe("29,441");
    expect(grouped(1234567.8)).toBe("1,234,568");
    expect(grouped(123.4)).toBe("123");
    expect(grouped(12.345)).toBe("12.3");
    expect(grouped(NaN)).toBe("NaN");
  });
});

describe("job clock", () => {
  const now = Date.parse("2025-01-01T10:00:00Z");
  it("counts seconds between timestamps, or up to now", () => {
    expect(secondsBetween("2025-01-01T09:59:00Z", "2025-01-01T10:00:30Z", now)).toBe(90);
    expect(secondsBetween("2025-01-01T09:59:00Z", null, now)).toBe(60);
    expect(secondsBetween(null, null, now)).toBeNull();
    expect(secondsBetween("not a time", null, now)).toBeNull();
  });

  it("says elapsed while running, the duration once finished, and the time queued before", () => {
    expect(jobClock({ status: "running", created_at: "2025-01-01T09:00:00Z", started_at: "2025-01-01T09:58:55Z", finished_at: null }, now)).toEqual([
      { label: "elapsed", seconds: 65, hint: expect.any(String) },
    ]);
    expect(jobClock({ status: "queued", created_at: "2025-01-01T09:59:30Z", started_at: null, finished_at: null }, now).map((c) => [c.label, c.seconds])).toEqual([["queued for", 30]]);
    const done = jobClock({ status: "completed", created_at: "2025-01-01T09:00:00Z", started_at: "2025-01-01T09:00:02Z", finished_at: "2025-01-01T09:01:00Z" }, now);
    expect(done.map((c) => [c.label, c.seconds])).toEqual([["duration", 58], ["since submitted", 60]]);
    expect(duration(done[0].seconds)).toBe("58 s");
    // cancelled while queued: it never ran
    expect(jobClock({ status: "cancelled", created_at: "2025-01-01T09:00:00Z", started_at: null, finished_at: "2025-01-01T09:00:05Z" }, now).map((c) => c.label)).toEqual(["since submitted"]);
    // no second line when it started the moment it was submitted
    expect(jobClock({ status: "failed", created_at: "2025-01-01T09:00:00Z", started_at: "2025-01-01T09:00:00.300Z", finished_at: "2025-01-01T09:00:10Z" }, now).map((c) => c.label)).toEqual(["duration"]);
  });
});
