import { describe, expect, it, vi } from "vitest";
import { adoptTokenFromLocation, apiToken, fieldErrorsOf, locToPath, tokenFromHash, withTicket, type Ticket } from "./api";

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

describe("login URL token", () => {
  it("reads #token= and keeps the rest of the fragment", () => {
    expect(tokenFromHash("#token=abc_-1")).toEqual({ token: "abc_-1", rest: "" });
    expect(tokenFromHash("token=abc")).toEqual({ token: "abc", rest: "" });
    expect(tokenFromHash("#token=abc&tab=logs")).toEqual({ token: "abc", rest: "#tab=logs" });
    expect(tokenFromHash("#token=a%2Bb%3D")).toEqual({ token: "a+b=", rest: "" });
    expect(tokenFromHash("#page")).toEqual({ token: null, rest: "#page" });
    expect(tokenFromHash("")).toEqual({ token: null, rest: "" });
    expect(tokenFromHash("#token=")).toEqual({ token: null, rest: "" });
  });

  it("stores the token and takes it out of the address bar", () => {
    const store = new Map<string, string>();
    vi.stubGlobal("localStorage", {
      getItem: (k: string) => store.get(k) ?? null,
      setItem: (k: string, v: string) => void store.set(k, v),
      removeItem: (k: string) => void store.delete(k),
    });
    try {
      const calls: unknown[][] = [];
      const hist = { state: null, replaceState: (...args: unknown[]) => void calls.push(args) } as unknown as History;
      const loc = { hash: "#token=s3cr3t", pathname: "/", search: "" } as Location;
      expect(adoptTokenFromLocation(loc, hist)).toBe(true);
      expect(apiToken()).toBe("s3cr3t");
      expect(calls).toEqual([[null, "", "/"]]);

      const other = { hash: "#page", pathname: "/jobs/3", search: "?x=1" } as Location;
      expect(adoptTokenFromLocation(other, hist)).toBe(false);
      expect(calls).toHaveLength(1); // an unrelated fragment is left alone
      expect(apiToken()).toBe("s3cr3t");

      const deep = { hash: "#token=n3w", pathname: "/jobs/3", search: "?x=1" } as Location;
      adoptTokenFromLocation(deep, hist);
      expect(apiToken()).toBe("n3w");
      expect(calls[1]).toEqual([null, "", "/jobs/3?x=1"]);
    } finally {
      vi.unstubAllGlobals();
    }
  });
});

describe("withTicket", () => {
  const issued: string[] = [];
  const issue = async (path: string): Promise<Ticket> => {
    issued.push(path);
    return { ticket: `k${issued.length}.s/+`, path, expires_at: "2030-01-01T00:00:00Z", expires_in_s: 60 };
  };

  it("leaves URLs alone without a token and asks for no ticket", async () => {
    issued.length = 0;
    expect(await withTicket("/api/jobs/1/events", null, issue)).toBe("/api/jobs/1/events");
    expect(issued).toEqual([]);
  });

  it("adds a fresh ticket for the path, never the token", async () => {
    issued.length = 0;
    expect(await withTicket("/api/jobs/1/events", "tok", issue)).toBe("/api/jobs/1/events?ticket=k1.s%2F%2B");
    expect(await withTicket("/api/jobs/1/events?last_event_id=4", "tok", issue)).toBe(
      "/api/jobs/1/events?last_event_id=4&ticket=k2.s%2F%2B",
    );
    expect(await withTicket("/api/jobs/9/export", "tok", issue)).not.toContain("tok");
    expect(issued).toEqual(["/api/jobs/1/events", "/api/jobs/1/events", "/api/jobs/9/export"]);
  });

  it("fails when no ticket can be had", async () => {
    await expect(withTicket("/api/jobs/1/export", "tok", () => Promise.reject(new Error("401")))).rejects.toThrow("401");
  });
});
