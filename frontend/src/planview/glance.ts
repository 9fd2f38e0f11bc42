// The plan at a glance (docs/interfaces.md §5): one verdict (the policy in words, step time, memory against its
// limits, what binds the step, the change with the most to gain), the alternatives a person compares (one row per
// route × activation mix × update placement, knob variants folded in), and memory as bars by part. Read from the
// plan JSON only: a figure the plan does not carry is not shown, never guessed.
import { h } from "../dom";
import { PHASE_TERMS, POLICY_TERMS, explain } from "../glossary";
import { isNum, num, seconds } from "../fmt";
import type { Candidate, ExecutionPolicy, Plan } from "../types";
import "./glance.css";

type Obj = Record<string, unknown>;

/** Below this share of a limit free, the verdict and the bars warn. */
export const LOW_HEADROOM = 0.05;
/** The planner's tie rule (runtime/slidedp/planning/knobs.py): a window, transfer chunk or loss chunk other than
 *  the default must make the step at least 0.1% faster to be taken. */
export const TIE_RULE = 0.001;

/** A share as a person reads it: "24%", "1.0%", "0.07%", "0%"; no float noise. */
export function pct(frac: number): string {
  const p = frac * 100;
  const a = Math.abs(p);
  if (a < 0.005) return "0%";
  if (a < 1) return `${p.toFixed(2)}%`;
  return a < 10 ? `${p.toFixed(1)}%` : `${Math.round(p)}%`;
}

/** A GiB figure: one decimal from 10 GiB ("127.8"), three significant digits below ("2.55"), "0" for noise. */
export function gibNum(v: number): string {
  if (Math.abs(v) < 5e-4) return "0";
  return Math.abs(v) >= 10 ? v.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 }) : num(v, 3);
}

export function gibs(v: number): string {
  return `${gibNum(v)} GiB`;
}

/** Seconds without float noise: anything under a microsecond is "0 ms". */
export function secs(v: number): string {
  return Math.abs(v) < 1e-6 ? "0 ms" : seconds(v);
}

/** A step rate: "11,579 tokens/s". */
export function tokensPerS(v: number): string {
  return `${Math.round(v).toLocaleString("en-US")} tokens/s`;
}

/** Counts of each activation choice across the decoder layers. */
export function activationMix(acts: readonly string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const a of acts) out[a] = (out[a] ?? 0) + 1;
  return out;
}

function layersWord(n: number): string {
  return `${n} layer${n === 1 ? "" : "s"}`;
}

/** The activation choices in words: "23 layers keep activations, the rest recompute". */
export function activationWords(acts: readonly string[]): string {
  const mix = activationMix(acts);
  const n = acts.length;
  const keep = mix.keep ?? 0;
  const off = mix.offload ?? 0;
  const rec = (mix.checkpoint ?? 0) + (mix.recompute ?? 0);
  if (n === 0) return "no decoder layers";
  if (keep === n) return `all ${layersWord(n)} keep activations`;
  if (rec === n) return `all ${layersWord(n)} recompute activations`;
  if (off === n) return `all ${layersWord(n)} offload activations to host memory`;
  const parts: string[] = [];
  const verb = (n: number, v: string) => (n === 1 ? `${v}s` : v);
  if (keep) parts.push(`${layersWord(keep)} ${verb(keep, "keep")} activations`);
  if (off) parts.push(`${layersWord(off)} ${verb(off, "offload")} them to host memory`);
  if (rec) parts.push(parts.length === 1 ? "the rest recompute" : `${layersWord(rec)} ${verb(rec, "recompute")}`);
  if (!rec && parts.length === 2) parts[1] = "the rest offload them to host memory";
  return parts.join(", ");
}

/** Where the optimizer update runs, in words. */
export function updateWords(p: ExecutionPolicy): string {
  const edge = `embedding/head updated on the ${p.edge_update === "gpu" ? "GPUs" : "host"}`;
  const dl = p.device_layers ?? 0;
  return dl > 0 ? `${edge}, ${layersWord(dl)} updated on the GPUs` : edge;
}

/** The policy in words: "Sharded delivery, GPU reduction; 4 layers keep activations, the rest recompute;
 *  embedding/head updated on the host". */
export function policyWords(p: ExecutionPolicy): string {
  const route = `${p.delivery === "sharded" ? "Sharded" : "Replicated"} delivery, ${p.grad_reduce === "gpu" ? "GPU" : "host"} reduction`;
  return `${route}; ${activationWords(p.activations ?? [])}; ${updateWords(p)}`;
}

/** One memory figure against its limit: "128 of 129 GiB per GPU — 1.0% free". */
export interface Headroom {
  used: number;
  limit: number;
  free: number; // share of the limit free (negative: over)
  low: boolean;
  text: string;
}

export function headroom(used: unknown, limit: unknown, where: string): Headroom | null {
  if (!isNum(used) || !isNum(limit) || limit <= 0) return null;
  const free = (limit - used) / limit;
  const tail = free < 0 ? `${gibs(used - limit)} over` : `${pct(free)} free`;
  return { used, limit, free, low: free < LOW_HEADROOM, text: `${gibNum(used)} of ${gibs(limit)} ${where} — ${tail}` };
}

const BINDING_WORDS: Record<string, string> = {
  compute: "GPU compute",
  cpu_update: "the CPU update (AdamW on the host)",
  h2d: "PCIe copies host → GPU",
  d2h: "PCIe copies GPU → host",
  host_dram: "host memory bandwidth",
  collective: "GPU collectives",
  recompute: "recomputing activations",
};

/** Whether the plan is for a job that trains on the CPU (gpus = 0): its compute is the CPU's, not a GPU's. */
export function onCpu(plan: Pick<Plan, "job">): boolean {
  return plan.job?.on_gpu === false;
}

export function resourceWords(key: string, cpu = false): string {
  if (cpu && key === "compute") return "CPU compute";
  return BINDING_WORDS[key] ?? key.replace(/_/g, " ");
}

/** What binds the step: the plan's physical bound, or without one its most exposed resource. */
export function bindingOf(plan: Plan): string | null {
  const pred = plan.predicted;
  if (!pred || !isNum(pred.step_time_s)) return null;
  const b = (pred.bound ?? null) as Obj | null;
  const terms = (b?.terms_s ?? null) as Record<string, number> | null;
  if (b && typeof b.binding === "string" && terms && isNum(terms[b.binding])) {
    const floor = isNum(b.step_time_s) ? `; this policy's physical floor is ${secs(b.step_time_s)} per step` : "";
    return `${resourceWords(b.binding, onCpu(plan))}: ${secs(terms[b.binding])} of work per step${floor}`;
  }
  const top = mostExposed(plan);
  return top ? `${resourceWords(top[0], onCpu(plan))}: ${secs(top[1])} of the step waits on it` : null;
}

function mostExposed(plan: Plan): [string, number] | null {
  const ex = plan.predicted?.exposed ?? {};
  let best: [string, number] | null = null;
  for (const [k, v] of Object.entries(ex)) if (isNum(v) && v > 0 && (!best || v > best[1])) best = [k, v];
  return best;
}

/** What differs between two policies, in words (only the choices a person picks between). */
export function differenceWords(p: ExecutionPolicy, from: ExecutionPolicy): string {
  const out: string[] = [];
  if (p.delivery !== from.delivery) out.push(`${p.delivery} delivery`);
  if (p.grad_reduce !== from.grad_reduce) out.push(`${p.grad_reduce === "gpu" ? "GPU" : "host"} reduction`);
  if (JSON.stringify(activationMix(p.activations ?? [])) !== JSON.stringify(activationMix(from.activations ?? []))) out.push(activationWords(p.activations ?? []));
  if (p.edge_update !== from.edge_update || (p.device_layers ?? 0) !== (from.device_layers ?? 0)) out.push(updateWords(p));
  for (const k of ["window", "chunk_mb", "loss_chunk_tokens"] as const) if (p[k] !== from[k]) out.push(`${POLICY_TERMS[k]?.label ?? k} ${p[k]}`);
  const resident = (q: ExecutionPolicy) => (q.resident ?? []).filter(Boolean).length;
  if (resident(p) !== resident(from)) out.push(`${resident(p)} of ${(p.resident ?? []).length} layers resident`);
  return out.join(", ");
}

/** The one change with the most to gain: a faster alternative that does not fit (with what it needs), or the
 *  resource the step waits on most (the plan's `exposed`), whichever saves more. Null when the plan says neither. */
export function bestChangeOf(plan: Plan): string | null {
  const pred = plan.predicted;
  const pol = plan.policy;
  if (!pred || !pol || !isNum(pred.step_time_s)) return null;
  const t = pred.step_time_s;
  let bestRejected: Candidate | null = null;
  for (const c of plan.candidates ?? []) {
    const ct = c.predicted?.step_time_s;
    if (!c.fits && isNum(ct) && ct < t && (!bestRejected || ct < (bestRejected.predicted.step_time_s as number))) bestRejected = c;
  }
  const exposed = mostExposed(plan);
  const rejectedGain = bestRejected ? t - (bestRejected.predicted.step_time_s as number) : 0;
  if (exposed && exposed[1] >= 0.01 * t && exposed[1] >= rejectedGain) {
    return `a faster ${resourceWords(exposed[0], onCpu(plan)).replace(/^the /, "")}: ${secs(exposed[1])} of the ${secs(t)} step (${pct(exposed[1] / t)}) waits on it`;
  }
  if (bestRejected && rejectedGain > 0) {
    const why = bestRejected.why_not ? ` but ${bestRejected.why_not}` : " but does not fit";
    return `${differenceWords(bestRejected.policy, pol)} would be ${pct(rejectedGain / t)} faster${why}`;
  }
  return null;
}

export interface Verdict {
  policy: string;
  step: string | null; // "2.83 s per step, 11,579 tokens/s"
  hbm: Headroom | null;
  host: Headroom | null;
  binds: string | null;
  change: string | null;
  warnings: string[]; // headroom below 5%
}

export function verdictOf(plan: Plan): Verdict | null {
  const pol = plan.policy;
  if (!pol) return null;
  const pred = plan.predicted;
  const job: Obj = plan.job ?? {};
  const step = pred && isNum(pred.step_time_s) ? `${secs(pred.step_time_s)} per step${isNum(pred.tokens_per_s) ? `, ${tokensPerS(pred.tokens_per_s)}` : ""}` : null;
  const hbm = headroom(pred?.hbm_peak_gib, job.hbm_budget_gib, "per GPU");
  const host = headroom(pred?.host_ram_gib, job.host_limit_gib, "host RAM");
  const warnings: string[] = [];
  for (const [what, r] of [["GPU memory", hbm], ["Host RAM", host]] as const) {
    if (!r?.low) continue;
    const state = r.free < 0 ? `${gibs(r.used - r.limit)} over the limit` : `only ${pct(r.free)} free`;
    warnings.push(`${what}: ${state} (${gibNum(r.used)} of ${gibs(r.limit)}${what === "GPU memory" ? " per GPU" : ""}), under the ${LOW_HEADROOM * 100}% margin: an error in the memory prediction could run the job out of memory.`);
  }
  return { policy: policyWords(pol), step, hbm, host, binds: bindingOf(plan), change: bestChangeOf(plan), warnings };
}

// ---------------------------------------------------------------- alternatives

export interface AltRow {
  policy: ExecutionPolicy;
  text: string; // the row's policy in words
  step_s: number | null;
  tokens_per_s: number | null;
  vsChosen: number | null; // (t - t_chosen) / t_chosen
  hbmFree: number | null; // share of the HBM budget free
  hbm_gib: number | null;
  fits: boolean;
  reason: string | null; // why it was not taken, in words
  chosen: boolean;
  variants: Candidate[]; // the other candidates folded into this row
  note: string | null; // the tie rule, where it applies
}

/** The row a candidate folds into: route × activation mix × update placement. */
export function foldKey(p: ExecutionPolicy): string {
  const mix = activationMix(p.activations ?? []);
  return [p.delivery, p.grad_reduce, p.delivery_cast, p.edge_update, p.device_layers ?? 0, mix.keep ?? 0, mix.offload ?? 0, (mix.checkpoint ?? 0) + (mix.recompute ?? 0)].join("|");
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

function isChosen(c: Candidate, pol: ExecutionPolicy | null): boolean {
  if (!pol) return false;
  const p: Obj = { ...pol };
  return Object.entries(c.policy).every(([k, v]) => same(v, p[k]));
}

const time = (c: Candidate): number => (isNum(c.predicted?.step_time_s) ? (c.predicted.step_time_s as number) : Infinity);

/** The alternatives a person compares: candidates folded by foldKey into their best row (the chosen policy's row
 *  is the chosen policy), fitting rows first, the chosen one at their head and the rest by predicted time, then
 *  rows that do not fit, by time, with why. */
export function alternativesOf(plan: Plan): AltRow[] {
  const pol = plan.policy;
  const budget = (plan.job ?? {}).hbm_budget_gib;
  const groups = new Map<string, Candidate[]>();
  for (const c of plan.candidates ?? []) {
    const k = foldKey(c.policy);
    groups.set(k, [...(groups.get(k) ?? []), c]);
  }
  const tChosen = isNum(plan.predicted?.step_time_s) ? (plan.predicted?.step_time_s as number) : null;
  const rows: AltRow[] = [];
  for (const members of groups.values()) {
    const sorted = [...members].sort((a, b) => Number(b.fits) - Number(a.fits) || time(a) - time(b));
    const rep = members.find((c) => isChosen(c, pol)) ?? sorted[0];
    const t = isNum(rep.predicted?.step_time_s) ? (rep.predicted.step_time_s as number) : null;
    const hbm = isNum(rep.predicted?.hbm_peak_gib) ? (rep.predicted.hbm_peak_gib as number) : null;
    const chosen = isChosen(rep, pol);
    const vs = t !== null && tChosen ? (t - tChosen) / tChosen : null;
    let note: string | null = null;
    if (!chosen && rep.fits && vs !== null && vs < 0) {
      note =
        -vs < TIE_RULE
          ? `${pct(-vs)} faster, within the ${TIE_RULE * 100}% a window, chunk or loss chunk other than the default must gain: defaults kept`
          : `${pct(-vs)} faster than the chosen plan`;
    }
    rows.push({
      policy: rep.policy,
      text: policyWords(rep.policy),
      step_s: t,
      tokens_per_s: isNum(rep.predicted?.tokens_per_s) ? (rep.predicted.tokens_per_s as number) : null,
      vsChosen: vs,
      hbm_gib: hbm,
      hbmFree: hbm !== null && isNum(budget) && budget > 0 ? (budget - hbm) / budget : null,
      fits: rep.fits,
      reason: rep.fits ? null : reasonWords(rep),
      chosen,
      variants: members.filter((c) => c !== rep).sort((a, b) => time(a) - time(b)),
      note,
    });
  }
  const t = (r: AltRow) => r.step_s ?? Infinity;
  return rows.sort((a, b) => Number(b.fits) - Number(a.fits) || Number(b.chosen) - Number(a.chosen) || t(a) - t(b) || (a.hbm_gib ?? 0) - (b.hbm_gib ?? 0));
}

/** Why a candidate was not taken, as a sentence. */
export function reasonWords(c: Candidate): string {
  const w = (c.why_not ?? "").trim();
  if (!w) return "Does not fit the memory limits.";
  return `Not taken: it ${w.replace(/\.$/, "")}.`;
}

// ---------------------------------------------------------------- memory bars

export interface MemPart {
  key: string;
  label: string;
  gib: number;
}

export interface MemBar {
  title: string; // "GPU memory, per GPU"
  parts: MemPart[]; // the plan's breakdown, zero parts left out
  total: number; // the plan's peak (sum of parts)
  limit: number | null;
  room: Headroom | null;
  note: string | null; // why the budget is below the card's size
}

const PART_WORDS: Record<string, string> = {
  window: "weights window",
  embedding_and_head: "embedding and head",
  resident_layers: "resident layer weights",
  gradients: "gradients",
  accumulation: "gradient accumulation",
  activations: "activations",
  offload_in_flight: "offloaded activations in flight",
  hidden_states: "hidden states",
  offload_fetch_slots: "offload fetch slots",
  transient: "transient (loss chunk, kernels)",
  master_and_moments: "fp32 master weights and AdamW moments",
  delivery_copy: "bf16 delivery copy",
  gradient_staging: "gradient staging",
  held_gradient: "held gradients",
  host_reduce_scratch: "host reduction scratch",
  offloaded_activations: "offloaded activations",
  rank_working_sets: "CPU ranks' working sets",
  rank_processes: "rank processes (CUDA runtime, torch)",
};

function partsOf(m: Record<string, number> | undefined): MemPart[] {
  return Object.entries(m ?? {})
    .filter(([, v]) => isNum(v) && v >= 5e-4)
    .map(([k, v]) => ({ key: k, label: PART_WORDS[k] ?? k.replace(/_/g, " "), gib: v }));
}

export function memoryBarsOf(plan: Plan): MemBar[] {
  const pred = plan.predicted;
  if (!pred) return [];
  const job: Obj = plan.job ?? {};
  const out: MemBar[] = [];
  const hbmParts = partsOf(pred.hbm_parts_gib);
  if (hbmParts.length || isNum(pred.hbm_peak_gib)) {
    const total = isNum(pred.hbm_peak_gib) ? pred.hbm_peak_gib : hbmParts.reduce((s, p) => s + p.gib, 0);
    const budget = isNum(job.hbm_budget_gib) ? job.hbm_budget_gib : null;
    let note: string | null = null;
    if (budget !== null && isNum(job.hbm_cap_gib) && isNum(job.hbm_card_gib) && job.hbm_cap_gib < job.hbm_card_gib) {
      note = `Per GPU: each GPU holds its own copy of these parts. The budget is ${gibs(budget)} of the job's gpu_memory_gib of ${gibs(job.hbm_cap_gib)} (the card has ${gibs(job.hbm_card_gib)}): the rest of the cap is left for the CUDA context, NCCL and fragmentation.`;
    } else if (budget !== null && isNum(job.hbm_card_gib)) {
      const frac = isNum(job.hbm_budget_fraction) ? ` (${pct(job.hbm_budget_fraction)})` : "";
      note = `Per GPU: each GPU holds its own copy of these parts. The budget is ${gibs(budget)}${frac} of the card's ${gibs(job.hbm_card_gib)}: the other ${gibs(job.hbm_card_gib - budget)} is left for the CUDA context, NCCL and fragmentation.`;
    } else if (budget !== null) note = "Per GPU: each GPU holds its own copy of these parts. The budget leaves room on the card for the CUDA context, NCCL and fragmentation.";
    if (note && isNum(job.allocator_slack_fraction)) note += ` Each part includes ${pct(job.allocator_slack_fraction)} for the caching allocator's rounding.`;
    out.push({ title: "GPU memory, per GPU", parts: hbmParts, total, limit: budget, room: headroom(total, budget, "per GPU"), note });
  }
  const hostParts = partsOf(pred.host_parts_gib);
  if (hostParts.length || isNum(pred.host_ram_gib)) {
    const total = isNum(pred.host_ram_gib) ? pred.host_ram_gib : hostParts.reduce((s, p) => s + p.gib, 0);
    const limit = isNum(job.host_limit_gib) ? job.host_limit_gib : null;
    const src = typeof job.host_limit_source === "string" ? ` (limit from the ${job.host_limit_source})` : "";
    out.push({ title: "Host RAM, whole job", parts: hostParts, total, limit, room: headroom(total, limit, "host RAM"), note: limit !== null ? `Shared by every rank of the job${src}.` : null });
  }
  return out;
}

// ---------------------------------------------------------------- rendering

const tip = (key: string): string | undefined => explain(key) ?? PHASE_TERMS[key]?.text;

function factRow(label: string, value: Node | string, title?: string): HTMLElement[] {
  return [h("dt", { title }, label), h("dd", null, value)];
}

export function renderVerdict(plan: Plan): HTMLElement | null {
  const v = verdictOf(plan);
  if (!v) return null;
  const box = h("div", { class: "plan-verdict", "data-part": "verdict" });
  if (v.warnings.length) box.append(h("div", { class: "warn-box headroom-warning", role: "status" }, v.warnings.map((w) => h("p", null, w))));
  box.append(h("p", { class: "verdict-policy", title: tip("delivery") }, h("strong", null, v.policy)));
  const dl = h("dl", { class: "facts verdict-facts" });
  if (v.step) dl.append(...factRow("Predicted", v.step, "The cost model's steady-state step time on this host's calibration."));
  if (v.hbm) dl.append(...factRow("GPU memory", v.hbm.text, explain("hbm_budget")));
  if (v.host) dl.append(...factRow("Host RAM", v.host.text, explain("host_limit")));
  if (v.binds) dl.append(...factRow("Binds the step", v.binds, "The largest term of the plan's physical bound: the resource this policy cannot make the step shorter than."));
  if (v.change) dl.append(...factRow("Most to gain", v.change, explain("exposed")));
  box.append(dl);
  return box;
}

function altCells(r: AltRow, budget: number | null): HTMLElement[] {
  const vs = r.chosen ? "chosen" : r.vsChosen === null ? "–" : r.vsChosen >= 0 ? `${pct(r.vsChosen)} slower` : `${pct(-r.vsChosen)} faster`;
  let room = "–";
  if (r.hbm_gib !== null) room = budget === null || r.hbmFree === null ? gibs(r.hbm_gib) : r.hbmFree < 0 ? `${gibs(r.hbm_gib - budget)} over` : `${pct(r.hbmFree)} free`;
  return [
    h("td", { class: "alt-policy" }, r.text, r.reason ? h("div", { class: "alt-reason" }, r.reason) : null, r.note ? h("div", { class: "alt-note" }, r.note) : null),
    h("td", { class: "num" }, r.step_s === null ? "–" : secs(r.step_s)),
    h("td", { class: "num alt-vs" }, vs),
    h("td", { class: "num" }, room),
    h("td", { class: "num" }, r.variants.length ? String(r.variants.length) : ""),
  ];
}

function variantText(c: Candidate, rep: ExecutionPolicy): string {
  const diff = differenceWords(c.policy, rep) || "same choices";
  const t = isNum(c.predicted?.step_time_s) ? secs(c.predicted.step_time_s as number) : "–";
  return `${diff}: ${t}${c.fits ? "" : ` — ${reasonWords(c)}`}`;
}

export function renderAlternatives(plan: Plan): HTMLElement | null {
  const rows = alternativesOf(plan);
  if (!rows.length) return null;
  const b = (plan.job ?? {}).hbm_budget_gib;
  const budget = isNum(b) ? b : null;
  const body = h("tbody", null);
  rows.forEach((r, i) => {
    const cls = ["alt-row", r.chosen ? "chosen-row" : "", r.fits ? "" : "rejected-row"].filter(Boolean).join(" ");
    const tr = h("tr", { class: cls, "data-step-s": r.step_s === null ? "" : String(r.step_s), "data-fits": String(r.fits) }, ...altCells(r, budget));
    body.append(tr);
    if (r.variants.length) {
      const id = `alt-variants-${i}`;
      const btn = h("button", { type: "button", class: "link variants-toggle", "aria-expanded": "false", "aria-controls": id }, `${r.variants.length} variant${r.variants.length === 1 ? "" : "s"}`);
      const list = h("tr", { id, class: "variants-row", hidden: true }, h("td", { colspan: "5" }, h("ul", null, r.variants.map((c) => h("li", null, variantText(c, r.policy))))));
      btn.addEventListener("click", () => {
        const open = btn.getAttribute("aria-expanded") !== "true";
        btn.setAttribute("aria-expanded", String(open));
        list.hidden = !open;
      });
      tr.lastElementChild?.replaceChildren(btn);
      body.append(list);
    }
  });
  const tie = rows.some((r) => r.note && r.note.includes("defaults kept"));
  return h(
    "div",
    { class: "plan-alternatives", "data-part": "alternatives" },
    h("p", { class: "muted" }, "One row per route, activation mix and update placement; window, chunk, loss chunk and resident-layer variants are folded into their row. Fitting rows first, by predicted step time; rows that do not fit are greyed with the reason."),
    tie ? h("p", { class: "muted tie-rule" }, `The planner keeps the default window, chunk and loss chunk unless another setting is at least ${TIE_RULE * 100}% faster (or makes the plan fit).`) : null,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "data-table alternatives-table" },
        h("caption", null, `${rows.length} alternative${rows.length === 1 ? "" : "s"} from ${(plan.candidates ?? []).length} candidates`),
        h(
          "thead",
          null,
          h(
            "tr",
            null,
            h("th", { scope: "col" }, "policy"),
            h("th", { scope: "col", title: "Predicted steady-state step time." }, "step time"),
            h("th", { scope: "col" }, "vs chosen"),
            h("th", { scope: "col", title: explain("hbm_budget") }, "HBM headroom"),
            h("th", { scope: "col" }, "variants"),
          ),
        ),
        body,
      ),
    ),
  );
}

export function renderMemoryBars(plan: Plan): HTMLElement | null {
  const bars = memoryBarsOf(plan);
  if (!bars.length) return null;
  const box = h("div", { class: "plan-memory", "data-part": "memory" });
  for (const b of bars) {
    const scale = Math.max(b.total, b.limit ?? 0) || 1;
    const track = h("div", { class: "mem-track", role: "img", "aria-label": `${b.title}: ${b.room?.text ?? gibs(b.total)}` });
    b.parts.forEach((p, i) => {
      track.append(h("span", { class: `mem-part mem-c${i % 8}`, style: `width:${((100 * p.gib) / scale).toFixed(3)}%`, title: `${p.label}: ${gibs(p.gib)}`, "data-gib": String(p.gib) }));
    });
    if (b.limit !== null) track.append(h("span", { class: "mem-limit", style: `left:${((100 * b.limit) / scale).toFixed(3)}%`, title: `limit ${gibs(b.limit)}` }));
    const legend = h(
      "ul",
      { class: "mem-legend" },
      b.parts.map((p, i) => h("li", null, h("span", { class: `mem-swatch mem-c${i % 8}` }), `${p.label} ${gibs(p.gib)}`)),
      b.limit !== null ? h("li", { class: "mem-legend-limit" }, `dashed line: limit ${gibs(b.limit)}`) : null,
    );
    box.append(
      h("div", { class: `mem-bar${b.room?.low ? " mem-low" : ""}` }, h("h4", null, b.title), h("p", { class: "mem-total" }, b.room ? `${b.room.text}: ${b.room.free < 0 ? "short by" : "margin"} ${gibs(Math.abs(b.room.limit - b.room.used))}` : `${gibs(b.total)} (no limit known)`), track, legend, b.room?.low ? h("p", { class: "warn-box headroom-warning" }, `Under ${LOW_HEADROOM * 100}% headroom: an error in the memory prediction could run the job out of memory.`) : null, b.note ? h("p", { class: "muted" }, b.note) : null),
    );
  }
  return box;
}

// ---------------------------------------------------------------- one step

export interface StepLane {
  key: string;
  label: string;
  segments: { key: string; label: string; s: number; title?: string }[];
}

const PHASE_WORDS: Record<string, string> = {
  data: "data",
  forward: "forward compute",
  backward: "backward compute",
  update_tail: "waiting on the host update",
  delivery_wait: "waiting on transfers",
};

const BUSY_WORDS: Record<string, string> = {
  compute: "GPU compute",
  h2d: "PCIe host → GPU",
  d2h: "PCIe GPU → host",
  coll: "GPU collectives",
  cpu: "CPU update",
};

/** The compute stream's name in the step picture: a CPU job (gpus = 0) computes on the CPU. */
export function streamWords(cpu: boolean): { stream: string; compute: string } {
  return cpu ? { stream: "CPU compute", compute: "CPU compute" } : { stream: "GPU stream", compute: "GPU compute" };
}

/** One predicted step: the compute stream's phases in their order (they partition the step), the engine's two
 *  spans, and how long each resource is busy in it (its length, not its place in time: the plan does not say
 *  when). Empty without times. `cpu`: the job trains on the CPU (the plan's own `job.on_gpu` unless told). */
export function stepLanesOf(plan: Plan, cpu = onCpu(plan)): { step_s: number; lanes: StepLane[] } | null {
  const words = streamWords(cpu);
  const pred = plan.predicted;
  if (!pred || !isNum(pred.step_time_s) || pred.step_time_s <= 0) return null;
  const lanes: StepLane[] = [];
  const phases = Object.entries(pred.phases ?? {}).filter(([, v]) => isNum(v) && v > 1e-6);
  if (phases.length)
    lanes.push({ key: "phases", label: words.stream, segments: phases.map(([k, v]) => ({ key: k, label: PHASE_WORDS[k] ?? k.replace(/_/g, " "), s: v, title: PHASE_TERMS[k]?.text })) });
  const spans = Object.entries(pred.spans ?? {}).filter(([, v]) => isNum(v) && v > 1e-6);
  if (spans.length) lanes.push({ key: "spans", label: "spans", segments: spans.map(([k, v]) => ({ key: k, label: `${k} span`, s: v, title: PHASE_TERMS[k]?.text })) });
  for (const [k, v] of Object.entries(pred.busy ?? {})) {
    if (!isNum(v) || v <= 1e-6) continue;
    lanes.push({ key: `busy-${k}`, label: k === "compute" ? words.compute : BUSY_WORDS[k] ?? k, segments: [{ key: k, label: "busy", s: v, title: explain("busy") }] });
  }
  return lanes.length ? { step_s: pred.step_time_s, lanes } : null;
}

/** What a run measured, drawn over the plan's step on the same scale (pages/jobstep.ts makes it from the metrics
 *  records): the median step and lanes of measured spans and busy times. */
export interface MeasuredStep {
  step_s: number;
  steps: number; // how many steps the medians are over
  lanes: StepLane[];
}

function laneRow(lane: StepLane, scale: number, end_s: number, measured: boolean): HTMLElement {
  const track = h("div", { class: "step-track" });
  lane.segments.forEach((seg, i) => {
    track.append(
      h("span", { class: `step-seg mem-c${(i * 2 + (measured ? 1 : 0)) % 8}`, style: `width:${((100 * seg.s) / scale).toFixed(3)}%`, title: `${seg.label}: ${secs(seg.s)}${seg.title ? `\n${seg.title}` : ""}` }, (100 * seg.s) / scale > 18 ? `${seg.label} ${secs(seg.s)}` : ""),
    );
  });
  track.append(h("span", { class: "step-end", style: `left:${((100 * end_s) / scale).toFixed(3)}%`, title: `end of the ${measured ? "measured" : "predicted"} step: ${secs(end_s)}` }));
  return h("div", { class: `step-lane${measured ? " step-measured" : ""}`, "data-lane": lane.key }, h("span", { class: "step-label" }, lane.label), track);
}

/** The plan's one step; with `measured`, the run's measured step above it on the same time scale. `cpu`: the job
 *  trains on the CPU. */
export function renderStep(plan: Plan, measured: MeasuredStep | null = null, cpu = onCpu(plan)): HTMLElement | null {
  const step = stepLanesOf(plan, cpu);
  if (!step && !measured) return null;
  const all = [...(step?.lanes ?? []), ...(measured?.lanes ?? [])];
  const scale = Math.max(step?.step_s ?? 0, measured?.step_s ?? 0, ...all.map((l) => l.segments.reduce((s, x) => s + x.s, 0)));
  const box = h("div", { class: "plan-step", "data-part": "step" });
  if (measured) {
    const vs = step ? `; predicted ${secs(step.step_s)}, so the run is ${pct(Math.abs(measured.step_s / step.step_s - 1))} ${measured.step_s >= step.step_s ? "slower" : "faster"} than planned` : "; the plan predicted no step time (no calibration)";
    box.append(h("p", { class: "step-measured-note" }, `Measured: ${secs(measured.step_s)} per step, the median of ${measured.steps} step${measured.steps === 1 ? "" : "s"} (the first left out)${vs}.`));
    for (const lane of measured.lanes) box.append(laneRow(lane, scale, measured.step_s, true));
  }
  if (step) {
    box.append(h("p", { class: "muted" }, `One predicted step of ${secs(step.step_s)}. The ${cpu ? "CPU compute" : "GPU stream"}'s phases and the two spans are in time order and add up to the step; the other lanes show how long each resource is busy per step, not when.`));
    for (const lane of step.lanes) box.append(laneRow(lane, scale, step.step_s, false));
  }
  return box;
}
