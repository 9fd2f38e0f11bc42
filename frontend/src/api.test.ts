import { describe, expect, it } from "vitest";
import { fieldErrorsOf, locToPath } from "./api";

describe("validation errors", () => {
  it("turns FastAPI locs into config key paths", () => {
    expect(locToPath(["body", "optimizer", "lr"])).toBe("optimizer.lr");
    expect(locToPath(["body", "optimizer", "betas", 1])).toBe("optimizer.betas[1]");
    expect(locToPath(["body"])).toBe("");
    expect(locToPath("optimizer.lr")).toBe("optimizer.lr");
  });

  it("reads FastAPI's 422 body and the config's own error list", () => {
    expect(fieldErrorsOf({ detail: [{ loc: ["body", "optimizer", "lr"], msg: "must be greater than 0.0, got -1.0", type: "value_error" }] })).toEqual([
      { loc: "optimizer.lr", msg: "must be greater than 0.0, got -1.0" },
    ]);
    expect(fieldErrorsOf({ detail: { errors: [{ loc: "data.path", msg: "no dataset file" }] } })).toEqual([{ loc: "data.path", msg: "no dataset file" }]);
    expect(fieldErrorsOf({ detail: "Redis is down" })).toEqual([]);
  });
});
