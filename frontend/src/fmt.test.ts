import { describe, expect, it } from "vitest";
import { axisNum, bytes, duration, num, seconds } from "./fmt";

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
});
