import { describe, expect, it } from "vitest";
import { fieldErrorsOf, locToPath, withToken } from "./api";

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

describe("withToken", () => {
  it("adds the API token for links and streams that cannot send headers", () => {
    expect(withToken("/api/jobs/1/events", null)).toBe("/api/jobs/1/events");
    expect(withToken("/api/jobs/1/events", "s3cr/t")).toBe("/api/jobs/1/events?access_token=s3cr%2Ft");
    expect(withToken("/api/jobs/1/events?last_event_id=4", "t")).toBe("/api/jobs/1/events?last_event_id=4&access_token=t");
  });
});
