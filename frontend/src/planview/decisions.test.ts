// The plan's decisions as sentences, on the shipped plans (Qwen3-8B on the two-H200 fixture host, micro-batch 4
// and 8): one per choice, with its reason in numbers and no symbol the page never explained. (The DOM around
// them, Why and the Details fold, is pinned by the browser test tests/e2e/test_plan_glance.py.)
import { describe, expect, it } from "vitest";
import bs4 from "../fixtures/plan-8b-bs4.json";
import bs8 from "../fixtures/plan-8b-bs8.json";
// Qwen3-4B, micro-batch 4, clipping at 1.0 on the declared 1x-rtx5090-128g host: AutoPolicy streams 24 layers
import clipped from "../fixtures/plan-4b-clipped.json";
import type { PlanAnswer } from "../plan";
import { decisions, sentence } from "./decisions";
import { explain } from "../glossary";

const p4 = bs4 as unknown as PlanAnswer;
const p8 = bs8 as unknown as PlanAnswer;
const pc = clipped as unknown as PlanAnswer;
const said = (p: PlanAnswer) => Object.fromEntries(decisions(p).map((d) => [d.topic, sentence(d)]));

describe("decisions", () => {
  it("gives the route with its margin over the next best route", () => {
    // micro-batch 8: replicated/gpu 2.828 s, sharded/gpu next at 2.850 s
    expect(said(p8).route).toBe(
      "Parameters are sent whole to each GPU (replicated) and gradients are summed between the GPUs (gpu): 2.83 s a step, 0.02 s faster than the next best route (sharded with gpu reduction, 2.85 s).",
    );
    expect(said(p4).route).toMatch(/^Parameters are split across the GPUs .* \(sharded\) and gradients are summed between the GPUs \(gpu\): 2\.53 s a step, 0\.03 s faster than the next best route \(replicated with gpu reduction, 2\.56 s\)\.$/);
  });

  it("says why some layers recompute: keeping every layer would not fit", () => {
    const a = said(p8).activations;
    expect(a).toMatch(/^23 of 36 layers keep their activations on the GPU \(keep\), 13 recompute them in the backward pass \(checkpoint\): keeping every layer's would need \d+\.\d GiB of GPU memory, more than the 129\.\d GiB budget, and each kept layer takes 3\.31 GiB\.$/);
    expect(said(p4).activations).toBe("All 36 layers keep their activations on the GPU (keep): recomputing a layer instead would add 0.2 ms a step, and the 1.66 GiB each kept layer takes fits.");
  });

  it("says where the update runs, why the GPUs' was not priced, the cast, the slots and what binds", () => {
    const s4 = said(p4);
    expect(s4.update).toBe("The host CPU runs the AdamW update of every layer (edge update and device layers 0): updating on the GPUs was not timed, as the calibration has no rate for the GPUs' AdamW.");
    expect(s4.cast).toBe("The bf16 weights are made on the host, by the CPU update (cast host): as the job's policy.delivery_cast sets it.");
    expect(s4.staging).toBe("8 host buffers hold gradients on their way to the CPU update (staging slots): at least the window of 2 plus one, so backward waits only when the CPU update falls that far behind.");
    expect(s4.bound).toBe("What limits the step most: cpu update (1.62 s of the 2.53 s step is waiting on it, beyond what overlap hides).");
    expect(Object.keys(s4)).toEqual(["route", "activations", "update", "cast", "staging", "bound"]);
  });

  it("says the cast scratch the plan reads from and what it buys, in the cast's sentence", () => {
    const pol = { ...p4.policy, delivery_cast: "gpu", cast_scratch_mb: 256 };
    const withScratch = { ...p4, policy: pol, cast_scratch: { mb: 256, step_time_s: 2.431, without_s: 2.528, fixed: false } } as unknown as PlanAnswer;
    expect(said(withScratch).cast).toBe("The bf16 weights are made on the GPUs from the fp32 master sent to them (cast gpu): as the job's policy.delivery_cast sets it. The cast reads from 256 MiB of scratch on each GPU, so the weights keep arriving while a cast waits for the layer computing: 0.10 s a step faster than without it.");
    const none = { ...p4, policy: { ...pol, cast_scratch_mb: 0 } } as unknown as PlanAnswer;
    expect(said(none).cast).not.toContain("scratch");
  });

  it("says whether the layers run compiled, with the calibrated times, and why not where they stay eager", () => {
    const chosen = { ...p8, compiled_layers: { chosen: true, by: "planner", eager_layer_s: 0.0433, compiled_layer_s: 0.0328, compile_s: 17.1, reason: "compiling makes a layer 24% faster" } } as PlanAnswer;
    expect(said(chosen).layers).toBe("The decoder layers run compiled (compiled layers): a layer's forward and backward take 32.8 ms against 43.3 ms eager, as calibrated; each GPU compiles them once as the job starts (about 17 s, while the host memory is filled).");
    const off = { ...p8, compiled_layers: { chosen: false, by: "config", eager_layer_s: 0.0433, compiled_layer_s: 0.0328, compile_s: 17.1, reason: "compiling makes a layer 24% faster" } } as PlanAnswer;
    expect(said(off).layers).toBe("The decoder layers run eager (compiled layers off, as the job's policy sets it): compiling makes a layer 24% faster.");
    const unpriced = { ...p8, compiled_layers: { chosen: true, by: "config", eager_layer_s: null, compiled_layer_s: null, compile_s: null, reason: "a declared host's figures time eager layers only" } } as PlanAnswer;
    expect(said(unpriced).layers).toBe("The decoder layers run compiled (compiled layers, as the job's policy sets it): a declared host's figures time eager layers only, so the predicted step times eager layers.");
    expect(Object.keys(said(chosen))).toContain("layers");
    expect(Object.keys(said(p8))).not.toContain("layers");
  });

  it("says what clipping costs, who updates what after the norm and where gradients wait", () => {
    const c = said(pc);
    expect(c.clipping).toBe(
      "Clipping at 1.0 costs +0.82 s (+27%) a step (3.93 s against 3.11 s for this policy without clipping, its streamed layers updated on the host): the host updates 8 of 36 layers, the GPUs 4 layers and the embedding and head, 24 stream through the GPU after the norm; gradients wait: 1.5 GiB in host memory (bf16), 4.5 GiB on the GPU (bf16).",
    );
    expect(Object.keys(c)).toEqual(["route", "activations", "update", "clipping", "cast", "headroom", "staging", "bound"]);
    // the streamed layers are the ones right after the device layers (slidedp.schedule.streamed_units)
    expect(c.update).toContain(" After the gradient norm the GPUs also update layers 5–28, streaming their state from host memory and back");
    const one = { ...pc, policy: { ...pc.policy, streamed_layers: 1 } } as PlanAnswer;
    expect(said(one).update).toContain("the GPUs also update layer 5, streaming");
    // the figures are the plan's own: its step time, and its section's unclipped pricing
    expect(pc.clipping?.step_time_s).toBe(pc.predicted?.step_time_s);
    // without clipping the plan has no section, and nothing is said
    expect(p8.clipping).toBeUndefined();
    expect(said(p8).clipping).toBeUndefined();
  });

  it("says a clipped plan without times is not timed, and an fp32 hold as such", () => {
    const base = pc.clipping!;
    const untimed = { ...pc, clipping: { ...base, step_time_s: null, unclipped_step_time_s: null, cost_s: null, cost_fraction: null, edge_update: "host" as const, device_layers: 0, streamed_layers: 0, held_bf16_gib: 0, gpu_waiting_gib: 0 } };
    expect(said(untimed).clipping).toBe("Clipping at 1.0 is not timed, as no calibration prices the plan: the host updates 8 of 36 layers and the embedding and head; gradients wait: 1.5 GiB in host memory (fp32).");
  });

  it("uses no symbol and gives every term hover text from the glossary", () => {
    for (const p of [p4, p8, pc]) {
      for (const d of decisions(p)) {
        expect(sentence(d)).not.toMatch(/τ|tau|T_j|k_bytes|\bk\b/);
        for (const part of d.parts) if (typeof part !== "string") expect(explain(part[1]), part[1]).toBeTruthy();
      }
    }
  });
});
