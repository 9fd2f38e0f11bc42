import { describe, expect, it } from "vitest";
import { declaredWords, planBody, planForOptions, type ProfileSummary } from "./planfor";

const rtx4090: ProfileSummary = {
  name: "1x-rtx4090-128g",
  description: "1x RTX 4090 (24 GB, PCIe Gen4 x16), 16-core desktop CPU, 128 GB DDR5",
  gpus: 1,
  gpu_name: "NVIDIA GeForce RTX 4090",
  gpu_memory_gib: 24,
  bf16_dense_tflops: 165.2,
  pcie: "Gen4 x16",
  p2p: false,
  host_ram_gib: 128,
  cores: 32,
  dram_gbps: 76.8,
};

describe("plan for a declared host", () => {
  it("says in the verdict area that the host is declared and nothing is measured", () => {
    // `declared` as POST /api/plan answers it with `profile`
    const plan = { declared: { profile: rtx4090.name, description: rtx4090.description, source: "shipped" } };
    expect(declaredWords(plan)).toBe(`Declared host: ${rtx4090.description} — predicted from declared figures, not measured`);
    expect(declaredWords({ declared: { profile: "mine", description: "" } })).toContain("Declared host: mine");
    expect(declaredWords({})).toBeNull();
    expect(declaredWords(null)).toBeNull();
  });

  it("offers this host first, then every shipped profile", () => {
    expect(planForOptions([rtx4090])).toEqual([
      { value: "", label: "This host" },
      { value: "1x-rtx4090-128g", label: `1x-rtx4090-128g — ${rtx4090.description}` },
    ]);
    expect(planForOptions([])).toEqual([{ value: "", label: "This host" }]);
  });

  it("sends the chosen profile instead of a host, and nothing extra for this host", () => {
    const cfg = { model: "qwen3-4b", gpus: 1, host: "gpu-box" };
    expect(planBody(cfg, "")).toBe(cfg);
    expect(planBody(cfg, "1x-rtx4090-128g")).toEqual({ model: "qwen3-4b", gpus: 1, profile: "1x-rtx4090-128g" });
  });
});
