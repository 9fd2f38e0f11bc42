import { describe, expect, it } from "vitest";
import { parseJson, quoteNonFinite } from "./json";

describe("parseJson", () => {
  it("reads Python's NaN and Infinity tokens as numbers", () => {
    const rec = parseJson<{ loss: number; grad_norm: number; x: number }>('{"loss": NaN, "grad_norm": Infinity, "x": -Infinity}');
    expect(Number.isNaN(rec.loss)).toBe(true);
    expect(rec.grad_norm).toBe(Infinity);
    expect(rec.x).toBe(-Infinity);
  });

  it("leaves NaN inside strings alone", () => {
    const v = parseJson<{ line: string; loss: number }>('{"line": "loss NaN at step 3", "loss": NaN}');
    expect(v.line).toBe("loss NaN at step 3");
    expect(Number.isNaN(v.loss)).toBe(true);
  });

  it("handles escaped quotes before a token", () => {
    expect(quoteNonFinite('["a\\"NaN", NaN]')).toBe('["a\\"NaN", "\\u0000NaN"]');
  });

  it("parses strict JSON unchanged and still rejects garbage", () => {
    expect(parseJson('{"step": 3, "hbm_peak_gib": [1.5, 2]}')).toEqual({ step: 3, hbm_peak_gib: [1.5, 2] });
    expect(() => parseJson("{step: 3}")).toThrow();
  });
});
