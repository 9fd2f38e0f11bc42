import { describe, expect, it } from "vitest";
import { fieldForLoc, getPath, jobKeys, leafPaths, setPath } from "./schema";

// The shape pydantic v2 writes for JobCreate (nested sections by $ref, Literal as enum, tuple as prefixItems).
const spec = {
  components: {
    schemas: {
      JobCreate: {
        type: "object",
        required: ["model", "data"],
        properties: {
          model: { type: "string", description: "A model." },
          data: { $ref: "#/components/schemas/JobDataConfig", description: "The dataset." },
          steps: { type: "integer", default: 10, exclusiveMinimum: 0 },
          optimizer: { $ref: "#/components/schemas/JobOptimizerConfig" },
          cpu_threads: { anyOf: [{ type: "integer", exclusiveMinimum: 0 }, { type: "null" }], default: null },
          precision: { enum: ["bf16", "fp32"], type: "string", default: "bf16" },
          name: { anyOf: [{ type: "string" }, { type: "null" }], default: null },
        },
      },
      JobDataConfig: {
        type: "object",
        required: ["path"],
        properties: { path: { type: "string" }, format: { enum: ["tokens", "text"], type: "string", default: "tokens" }, shuffle: { type: "boolean", default: true } },
      },
      JobOptimizerConfig: {
        type: "object",
        properties: {
          lr: { type: "number", default: 1e-5, description: "Peak learning rate of AdamW." },
          betas: { type: "array", prefixItems: [{ type: "number" }, { type: "number" }], minItems: 2, maxItems: 2, default: [0.9, 0.95] },
        },
      },
    },
  },
};

describe("jobKeys", () => {
  it("flattens nested sections into dotted keys with type, choices, default and doc", () => {
    const keys = jobKeys(spec);
    expect(keys.map((k) => k.path)).toEqual(["model", "data.path", "data.format", "data.shuffle", "steps", "optimizer.lr", "optimizer.betas", "cpu_threads", "precision", "name"]);
    const by = Object.fromEntries(keys.map((k) => [k.path, k]));
    expect(by["model"]).toMatchObject({ type: "string", required: true, hasDefault: false });
    expect(by["data.path"]).toMatchObject({ type: "string", required: true });
    expect(by["data.format"]).toMatchObject({ type: "enum", options: ["tokens", "text"], default: "tokens" });
    expect(by["optimizer.lr"]).toMatchObject({ type: "number", default: 1e-5, description: "Peak learning rate of AdamW." });
    expect(by["optimizer.betas"]).toMatchObject({ type: "pair", default: [0.9, 0.95] });
    expect(by["cpu_threads"]).toMatchObject({ type: "integer", nullable: true, default: null });
    expect(by["data.shuffle"].type).toBe("boolean");
  });

  it("returns nothing for a document without the schema", () => {
    expect(jobKeys({})).toEqual([]);
    expect(jobKeys(null)).toEqual([]);
  });
});

describe("paths", () => {
  it("sets, reads and lists nested keys", () => {
    const o: Record<string, unknown> = {};
    setPath(o, "optimizer.lr", 0.1);
    setPath(o, "model", "tiny-qwen3");
    expect(o).toEqual({ optimizer: { lr: 0.1 }, model: "tiny-qwen3" });
    expect(getPath(o, "optimizer.lr")).toBe(0.1);
    expect(getPath(o, "optimizer.eps")).toBeUndefined();
    expect(leafPaths({ a: 1, b: { c: [1, 2], d: { e: null } } })).toEqual(["a", "b.c", "b.d.e"]);
  });

  it("finds the field that owns an error location", () => {
    const fields = new Set(["optimizer.lr", "optimizer.betas", "data.path"]);
    expect(fieldForLoc("optimizer.lr", fields)).toBe("optimizer.lr");
    expect(fieldForLoc("optimizer.betas[1]", fields)).toBe("optimizer.betas");
    expect(fieldForLoc("data.path.x", fields)).toBe("data.path");
    expect(fieldForLoc("bogus", fields)).toBeNull();
    expect(fieldForLoc("", fields)).toBeNull();
  });
});
