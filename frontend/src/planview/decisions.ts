// The plan's decisions in a user's words: one sentence per choice (route, activations, where the update runs,
// what clipping costs and where gradients wait for its norm, compiled or eager layers, the bf16 cast, gradient staging slots, what binds the step), each with its reason in numbers read from the plan
// JSON (docs/interfaces.md §5); and a refusal's ways out (`ways_out`). Every policy term is hover text from the
// glossary, so no sentence leans on a name the page never explained.
import { h } from "../dom";
import { explain } from "../glossary";
import type { Candidate, ClippingCost, CompiledLayers } from "../types";
import type { PlanAnswer } from "../plan";

/** A sentence as parts: plain text, or [shown words, glossary key] for a term with hover text. */
export type Part = string | [string, string];
export interface Decision {
  topic: "route" | "activations" | "update" | "clipping" | "layers" | "cast" | "headroom" | "staging" | "bound";
  parts: Part[];
}

const GIB = 2 ** 30;
const s = (x: number) => `${x.toFixed(2)} s`;
const ms = (x: number) => `${(Math.abs(x) * 1e3).toFixed(1)} ms`;

/** The sentence as plain text (tests, and the title of a list item). */
export function sentence(d: Decision): string {
  return d.parts.map((p) => (typeof p === "string" ? p : p[0])).join("");
}

function fastest(cands: Candidate[], pick: (c: Candidate) => boolean): Candidate | null {
  let best: Candidate | null = null;
  for (const c of cands) {
    const t = c.predicted.step_time_s;
    if (c.fits && t !== null && pick(c) && (best === null || t < (best.predicted.step_time_s as number))) best = c;
  }
  return best;
}

const DELIVERY: Record<string, string> = { replicated: "sent whole to each GPU", sharded: "split across the GPUs (each receives its share and the GPUs exchange the rest)" };
const REDUCE: Record<string, string> = { gpu: "summed between the GPUs", host: "summed on the host" };

/** One sentence per decision of a feasible plan; [] without a policy. */
export function decisions(plan: PlanAnswer): Decision[] {
  const pol = plan.policy;
  if (!pol) return [];
  const cands = plan.candidates ?? [];
  const t = plan.predicted?.step_time_s ?? null;
  const world = Number((plan.job as Record<string, unknown> | undefined)?.world ?? 1);
  const out: Decision[] = [];

  // route
  const route: Part[] = ["Parameters are ", DELIVERY[pol.delivery] ?? pol.delivery, " (", [pol.delivery, `delivery.${pol.delivery}`], ")"];
  if (world <= 1) route.push(" and gradients come back to the host for the update: with one GPU there is no route to choose.");
  else {
    route.push(" and gradients are ", REDUCE[pol.grad_reduce] ?? pol.grad_reduce, " (", [pol.grad_reduce, `grad_reduce.${pol.grad_reduce}`], ")");
    const other = fastest(cands, (c) => c.policy.delivery !== pol.delivery || c.policy.grad_reduce !== pol.grad_reduce);
    if (t !== null && other && other.predicted.step_time_s !== null) {
      const d = other.predicted.step_time_s - t;
      route.push(`: ${s(t)} a step, ${s(Math.max(0, d))} faster than the next best route (${other.policy.delivery} with ${other.policy.grad_reduce} reduction, ${s(other.predicted.step_time_s)}).`);
    } else route.push(t === null ? ": chosen from the link between the GPUs, as no calibration times the routes." : ": the only route that fits.");
  }
  out.push({ topic: "route", parts: route });

  // activations
  const L = pol.activations.length;
  const n = (p: string) => pol.activations.filter((a) => a === p).length;
  const keep = n("keep"), off = n("offload"), ckpt = n("checkpoint");
  const m = plan.marginal;
  const layerGib = m ? m.k_bytes / GIB : null;
  const acts: Part[] = [];
  if (keep === L) acts.push(`All ${L} layers keep their activations on the GPU (`, ["keep", "activations.keep"], ")");
  else {
    acts.push(`${keep} of ${L} layers keep their activations on the GPU (`, ["keep", "activations.keep"], ")");
    if (off) acts.push(`, ${off} send them to host memory (`, ["offload", "activations.offload"], ")");
    if (ckpt) acts.push(`, ${ckpt} recompute them in the backward pass (`, ["checkpoint", "activations.checkpoint"], ")");
  }
  const allKeep = cands.find((c) => !c.fits && c.policy.activations.every((a) => a === "keep"));
  const budget = Number((plan.job as Record<string, unknown> | undefined)?.hbm_budget_gib ?? NaN);
  const keepGain = m?.delta_s?.keep;
  if (keep < L && allKeep?.predicted.hbm_peak_gib != null && Number.isFinite(budget)) {
    acts.push(`: keeping every layer's would need ${allKeep.predicted.hbm_peak_gib.toFixed(1)} GiB of GPU memory, more than the ${budget.toFixed(1)} GiB budget`);
    if (layerGib) acts.push(`, and each kept layer takes ${layerGib.toFixed(2)} GiB`);
    acts.push(".");
  } else if (keepGain !== undefined && keepGain < 0) {
    acts.push(`: recomputing a layer instead would add ${ms(keepGain)} a step`, layerGib ? `, and the ${layerGib.toFixed(2)} GiB each kept layer takes fits.` : ".");
  } else acts.push(t === null ? ": the mix that fits the memory, as nothing is timed." : ".");
  out.push({ topic: "activations", parts: acts });

  // where the update runs
  const onGpu = pol.edge_update === "gpu" || pol.device_layers > 0;
  const upd: Part[] = onGpu
    ? ["The GPUs run the AdamW update of ", pol.edge_update === "gpu" ? ["the embedding and the loss head", "edge_update.gpu"] : "", pol.edge_update === "gpu" && pol.device_layers ? " and of " : "", pol.device_layers ? [`the first ${pol.device_layers} layers`, "device_layers"] : "", "; the host CPU updates the rest"]
    : ["The host CPU runs the AdamW update of every layer (", ["edge update", "edge_update.host"], " and ", ["device layers", "device_layers"], " 0)"];
  const alt = fastest(cands, (c) => (c.policy.edge_update === "gpu" || c.policy.device_layers > 0) !== onGpu);
  if (t !== null && alt?.predicted.step_time_s != null) upd.push(`: ${s(Math.max(0, alt.predicted.step_time_s - t))} a step faster than ${onGpu ? "updating everything on the host" : "updating on the GPUs"} (${s(alt.predicted.step_time_s)}).`);
  else if (!onGpu && t !== null && /device AdamW rate/.test(plan.why ?? "")) upd.push(": updating on the GPUs was not timed, as the calibration has no rate for the GPUs' AdamW.");
  else upd.push(".");
  const streamed = pol.streamed_layers ?? 0;
  if (streamed > 0) upd.push(" After the gradient norm the GPUs also update ", [streamed === 1 ? `layer ${pol.device_layers + 1}` : `layers ${pol.device_layers + 1}–${pol.device_layers + streamed}`, "streamed_layers"], ", streaming their state from host memory and back, while the host CPU updates the others.");
  out.push({ topic: "update", parts: upd.filter((p) => p !== "") });

  // what clipping costs, who updates what after the norm, where the gradients wait for it (the plan's `clipping`)
  const clip = clipping(plan.clipping, world);
  if (clip) out.push({ topic: "clipping", parts: clip });

  // compiled or eager layers (the plan's `compiled_layers`)
  const layers = compiledLayers(plan.compiled_layers);
  if (layers) out.push({ topic: "layers", parts: layers });

  // the bf16 cast
  const choice = (plan as { delivery_cast_choice?: { chosen: string; host: CastRow; gpu: CastRow } }).delivery_cast_choice;
  const where = pol.delivery_cast === "gpu" ? "on the GPUs from the fp32 master sent to them" : "on the host, by the CPU update";
  const cast: Part[] = ["The bf16 weights are made ", where, " (", [`cast ${pol.delivery_cast}`, `delivery_cast.${pol.delivery_cast}`], ")"];
  if (choice) {
    const other = pol.delivery_cast === "gpu" ? choice.host : choice.gpu;
    if (!other.fits) cast.push(`: the other cast does not fit (${other.why_not ?? "over memory"}).`);
    else if (t !== null && other.step_time_s !== null) cast.push(`: ${s(Math.max(0, other.step_time_s - t))} a step faster than the other cast.`);
    else cast.push(": the host's on a tie, as nothing is timed.");
  } else cast.push(": as the job's policy.delivery_cast sets it.");
  // ... through a scratch on each GPU (the plan's `cast_scratch`), with what it buys
  const scratch = (plan as { cast_scratch?: CastScratchRow }).cast_scratch;
  if (scratch && pol.delivery_cast === "gpu") {
    const saved = scratch.without_s - scratch.step_time_s;
    cast.push(" The cast reads from ", [`${scratch.mb} MiB of scratch`, "cast_scratch_mb"],
      ` on each GPU${scratch.fixed ? " (as the job sets it)" : ""}, so the weights keep arriving while a cast waits for the layer computing: `,
      saved >= 0 ? `${s(saved)} a step faster than without it.` : `${s(-saved)} a step slower than without it.`);
  }
  out.push({ topic: "cast", parts: cast });

  // the safety margin of GPU memory (docs/planning.md "Headroom"): said only where the fastest plan lacks it
  const room = (plan as { headroom?: HeadroomRow }).headroom;
  if (room && room.fastest_free_fraction < room.margin_fraction) {
    const pc = (x: number) => `${(100 * x).toFixed(1)}%`;
    out.push({ topic: "headroom", parts: [room.outcome.startsWith("took")
      ? `The fastest plan found left ${pc(room.fastest_free_fraction)} of the GPU memory budget free, under the ${pc(room.margin_fraction)} safety margin; this one is ${pc(Math.max(0, room.slower_by_fraction))} slower and leaves ${pc(room.chosen_free_fraction)} free.`
      : `This plan leaves ${pc(room.chosen_free_fraction)} of the GPU memory budget free, under the ${pc(room.margin_fraction)} safety margin: no plan within ${pc(room.max_slower_fraction)} of its step time keeps the margin.`] });
  }

  // gradient staging slots
  out.push({
    topic: "staging",
    parts: [`${pol.staging_slots} host buffers hold gradients on their way to the CPU update (`, ["staging slots", "staging_slots"], `): at least the window of ${pol.window} plus one, so backward waits only when the CPU update falls that far behind.`],
  });

  // what binds the step
  const exp = plan.predicted?.exposed ?? {};
  const top = Object.entries(exp).sort((a, b) => b[1] - a[1])[0];
  if (t !== null && top && top[1] > 0.01 * t) {
    out.push({ topic: "bound", parts: ["What limits the step most: ", [top[0].replace(/_/g, " "), "exposed"], ` (${s(top[1])} of the ${s(t)} step is waiting on it, beyond what overlap hides).`] });
  }
  return out;
}

/** The layers sentence: "The decoder layers run compiled (…): a layer's forward and backward take 32.8 ms against
 *  43.3 ms eager, as calibrated; each GPU compiles them once as the job starts (about 17 s)." null without the
 *  section (layers that can only be eager). */
function compiledLayers(c: CompiledLayers | undefined): Part[] | null {
  if (!c) return null;
  const who = c.by === "config" ? ", as the job's policy sets it" : "";
  if (!c.chosen) return ["The decoder layers run eager (", ["compiled layers", "compiled_layers"], ` off${who}): ${c.reason}.`];
  const out: Part[] = ["The decoder layers run compiled (", ["compiled layers", "compiled_layers"], `${who})`];
  if (c.compiled_layer_s !== null && c.eager_layer_s !== null) {
    out.push(`: a layer's forward and backward take ${ms(c.compiled_layer_s)} against ${ms(c.eager_layer_s)} eager, as calibrated`);
    out.push(c.compile_s !== null ? `; each GPU compiles them once as the job starts (about ${c.compile_s.toFixed(0)} s, while the host memory is filled).` : ".");
  } else out.push(`: ${c.reason}, so the predicted step times eager layers.`);
  return out;
}

const gib = (x: number) => (x >= 0.1 ? `${x.toFixed(1)} GiB` : `${(x * 1024).toFixed(1)} MiB`);
const signed = (x: number, text: string) => `${x < 0 ? "−" : "+"}${text}`;

/** The clipping sentence: "Clipping at 1.0 costs +0.82 s (+27%) a step (…): the host updates 8 of 36 layers, the
 *  GPUs 4 layers and the embedding and head, 24 stream through the GPU after the norm; gradients wait: 1.5 GiB in
 *  host memory (bf16), 4.5 GiB on the GPU (bf16)." null without the section (a job without clipping). */
function clipping(c: ClippingCost | undefined, world: number): Part[] | null {
  if (!c) return null;
  const gpu = world > 1 ? "the GPUs" : "the GPU";
  const norm = Number.isInteger(c.max_grad_norm) ? c.max_grad_norm.toFixed(1) : String(c.max_grad_norm);
  const out: Part[] = [[`Clipping at ${norm}`, "clip_threshold"]];
  if (c.cost_s !== null && c.cost_fraction !== null && c.step_time_s !== null && c.unclipped_step_time_s !== null) {
    const change = Object.keys(c.unclipped_change ?? {}).length ? ", its streamed layers updated on the host" : "";
    out.push(` costs ${signed(c.cost_s, s(Math.abs(c.cost_s)))} (${signed(c.cost_fraction, `${Math.abs(100 * c.cost_fraction).toFixed(0)}%`)}) a step (${s(c.step_time_s)} against ${s(c.unclipped_step_time_s)} for this policy without clipping${change})`);
  } else out.push(" is not timed, as no calibration prices the plan");
  out.push(`: the host updates ${c.host_layers} of ${c.layers} layers`);
  if (c.edge_update !== "gpu") out.push(" and the embedding and head");
  if (c.device_layers || c.edge_update === "gpu") {
    out.push(", the GPUs ");
    if (c.device_layers) out.push([`${c.device_layers} layer${c.device_layers === 1 ? "" : "s"}`, "device_layers"]);
    if (c.device_layers && c.edge_update === "gpu") out.push(" and ");
    if (c.edge_update === "gpu") out.push(["the embedding and head", "edge_update.gpu"]);
  }
  if (c.streamed_layers) out.push(", ", [`${c.streamed_layers} stream through ${gpu}`, "streamed_layers"], " after the norm");
  const held = c.held_gradient_gib;
  const kind = held <= 0 ? "" : c.held_bf16_gib >= held ? " (bf16)" : c.held_bf16_gib > 0 ? ` (${gib(c.held_bf16_gib)} of it bf16)` : " (fp32)";
  out.push(`; gradients wait: ${held > 0 ? `${gib(held)} in host memory${kind}` : "none in host memory"}`);
  if (c.gpu_waiting_gib > 0) out.push(`, ${gib(c.gpu_waiting_gib)} on ${world > 1 ? "each GPU" : "the GPU"} (${c.gpu_waiting_bf16 ? "bf16" : "fp32"})`);
  out.push(".");
  return out;
}

interface HeadroomRow {
  margin_fraction: number;
  max_slower_fraction: number;
  chosen_free_fraction: number;
  fastest_free_fraction: number;
  slower_by_fraction: number;
  outcome: string;
}

interface CastScratchRow {
  mb: number;
  step_time_s: number;
  without_s: number;
  fixed: boolean;
}

interface CastRow {
  fits: boolean;
  step_time_s: number | null;
  why_not: string | null;
}

function renderParts(parts: Part[]): (string | HTMLElement)[] {
  return parts.map((p) => (typeof p === "string" ? p : h("span", { class: "term", title: explain(p[1]) ?? p[0], "data-term": p[1] }, p[0])));
}

/** The decisions as a list, or null when there are none. */
export function renderDecisions(plan: PlanAnswer): HTMLElement | null {
  const ds = decisions(plan);
  if (!ds.length) return null;
  return h("ul", { class: "plan-decisions" }, ds.map((d) => h("li", { "data-topic": d.topic }, ...renderParts(d.parts))));
}

export interface WayOut {
  change: Record<string, unknown>;
  fits: boolean;
  summary: string;
}

/** A refusal's ways out (`ways_out`), each change that fits with its figures; null without any. */
export function renderWaysOut(plan: PlanAnswer): HTMLElement | null {
  const ways = ((plan as { ways_out?: WayOut[] }).ways_out ?? []).filter((w) => w.fits);
  if (!ways.length) return null;
  return h(
    "div",
    { class: "plan-ways-out", "data-part": "ways-out" },
    h("p", null, "Any one of these changes fits (each checked against the memory model):"),
    h("ul", null, ways.map((w) => h("li", null, w.summary))),
  );
}
