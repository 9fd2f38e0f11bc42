// The AutoPolicy plan (docs/interfaces.md §5) as the API answers it: the preview of POST /api/plan, and a job's
// policy column (the plan made at submit time; after a run, stage "resolved" and `policy` the one the engine ran).
// Its parts get their own place (policy, prediction, memory fit, candidates, the why), every other key is listed
// under its own name, and nothing absent is filled in. What blocks the job and what to watch come first, before
// any verdict: a plan with a blocking problem is never shown as feasible.
import { h } from "./dom";
import { bytes, gbps, gib, isNum, num, percent, seconds, words } from "./fmt";
import type { Candidate, FieldErrorItem, Marginal, Plan, Prediction } from "./types";
import { renderAlternatives, renderMemoryBars, renderStep, renderVerdict } from "./planview/glance";
import { matchWords } from "./calibration";
import { renderDeclared } from "./planview/planfor";
import { renderCardSweep } from "./planview/cardsweep";
import { renderDecisions, renderWaysOut } from "./planview/decisions";

type Obj = Record<string, unknown>;

/** The plan as POST /api/plan answers it: opened by `problems` (what the job would be refused for; `feasible` is
 *  then false) and `warnings` (what does not stop it), with `fits` the plan's own verdict. A job's stored policy
 *  has none of the three. */
export type PlanAnswer = Plan & { problems?: FieldErrorItem[]; warnings?: FieldErrorItem[]; fits?: boolean };

const said = (e: FieldErrorItem) => (e.loc ? `${e.loc}: ${e.msg}` : e.msg);

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const UNIT = /_(s|gib|bytes|gbps|gb_s)$/i;

/** A key as words without its unit suffix (the value carries the unit): "step_time_s" -> "step time". */
export function label(key: string): string {
  if (/per_s$/i.test(key)) return words(key); // a rate: "tokens per s" is the name, not a unit suffix
  return words(key.replace(UNIT, "")) || words(key);
}

/** A value formatted by what its key says it is: *_s seconds, *_gib GiB, *_bytes bytes, *_gbps GB/s. */
export function fmtByKey(key: string, v: unknown): string {
  if (v === null || v === undefined) return "–";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "number") {
    const k = key.toLowerCase();
    if (!Number.isFinite(v)) return num(v);
    if (k === "tokens_per_s" || k.endsWith("tokens_per_s")) return `${num(v, 4)} tokens/s`;
    // below a nanosecond / a byte is float noise of a sum, not a figure: "0"
    if (k.endsWith("_s") || k === "s" || k.endsWith("seconds")) return Math.abs(v) < 1e-9 ? "0 ms" : seconds(v);
    if (k.endsWith("_gib") || k === "gib") return Math.abs(v) < 1e-9 ? "0 GiB" : gib(v);
    if (k.endsWith("bytes")) return bytes(v);
    if (k.endsWith("gbps") || k.endsWith("gb_s")) return gbps(v);
    if (k === "mfu" || k.endsWith("_frac") || k.endsWith("_ratio") || k.endsWith("fraction")) return percent(v);
    return num(v, 4);
  }
  if (typeof v === "string") return v;
  if (Array.isArray(v) && v.length === 0) return "none";
  if (Array.isArray(v) && v.every((x) => !isObj(x) && !Array.isArray(x))) {
    return runs(v.map((x) => fmtByKey(key, x)));
  }
  if (isObj(v) && Object.values(v).every((x) => !isObj(x) && !Array.isArray(x))) {
    // {"h2d_s": 0.1} and "exposure_s": {"h2d": 0.1} both read "h2d 100 ms".
    return Object.entries(v)
      .map(([k, x]) => `${words(k.replace(UNIT, ""))} ${fmtByKey(UNIT.test(k) ? k : key, x)}`)
      .join(", ");
  }
  return JSON.stringify(v);
}

/** Per-unit lists read better as runs: ["checkpoint", "checkpoint", "keep"] -> "checkpoint ×2, keep". */
export function runs(items: string[]): string {
  if (items.length <= 3) return items.join(", ");
  const out: string[] = [];
  for (let i = 0; i < items.length; ) {
    let j = i;
    while (j < items.length && items[j] === items[i]) j++;
    out.push(j - i > 1 ? `${items[i]} ×${j - i}` : items[i]);
    i = j;
  }
  return out.join(", ");
}

/** A two-column list of an object's entries; nested objects become nested lists. With `skipEmpty`, null and
 *  empty values are left out (a prediction that has no figure for something shows nothing for it). */
export function kvList(obj: Obj, skip: ReadonlySet<string> = new Set(), skipEmpty = false): HTMLElement {
  const dl = h("dl", { class: "facts" });
  for (const [k, v] of Object.entries(obj)) {
    if (skip.has(k) || v === undefined || (skipEmpty && isEmpty(v))) continue;
    let dd: Node;
    if (isObj(v) && Object.values(v).some((x) => isObj(x) || Array.isArray(x))) dd = kvList(v, new Set(), skipEmpty);
    else if (Array.isArray(v) && v.some(isObj)) dd = objectTable(v.filter(isObj));
    else dd = document.createTextNode(fmtByKey(k, v));
    dl.append(h("dt", null, label(k)), h("dd", null, dd));
  }
  return dl;
}

/** A row with its nested objects spread into columns ({"policy": {"delivery": x}} -> {"delivery": x}); a key
 *  that would collide keeps its parent's name ("memory.host_ram_gib"). */
export function flattenRow(row: Obj): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(row)) {
    if (isObj(v) && Object.values(v).every((x) => !isObj(x))) {
      for (const [k2, v2] of Object.entries(v)) out[k2 in out || k2 in row ? `${k}.${k2}` : k2] = v2;
    } else out[k] = v;
  }
  return out;
}

/** A table of objects: one row each, one column per key (in first-seen order). */
export function objectTable(rawRows: Obj[], highlight?: (row: Obj) => boolean, caption?: string): HTMLElement {
  const rows = rawRows.map(flattenRow);
  const cols: string[] = [];
  for (const r of rows) for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
  // A column empty in every row says nothing.
  const shown = cols.filter((c) => rows.some((r) => !isEmpty(r[c])));
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "data-table" },
      caption ? h("caption", null, caption) : null,
      h("thead", null, h("tr", null, shown.map((c) => h("th", { scope: "col", title: c }, label(c.split(".").pop() ?? c))))),
      h(
        "tbody",
        null,
        rows.map((r, i) =>
          h(
            "tr",
            { class: highlight?.(rawRows[i]) ? "chosen-row" : undefined },
            shown.map((c) => h("td", { class: isNum(r[c]) ? "num" : undefined }, fmtByKey(c.split(".").pop() ?? c, r[c]))),
          ),
        ),
      ),
    ),
  );
}

function isEmpty(v: unknown): boolean {
  return v === null || v === undefined || (isObj(v) && Object.keys(v).length === 0) || (Array.isArray(v) && v.length === 0);
}

/** Only the entries that hold something. */
function present(o: Obj): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(o)) if (!isEmpty(v)) out[k] = v;
  return out;
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

// The prediction's memory figures, shown under memory fit.
const MEMORY_FIGURES = new Set(["hbm_peak_gib", "host_ram_gib", "hbm_parts_gib", "host_parts_gib"]);

/** The prediction without its memory figures; its per-phase maps are seconds. */
function predictionOf(p: Prediction | null): Obj | null {
  if (!p) return null;
  const out = present({ step_time_s: p.step_time_s, tokens_per_s: p.tokens_per_s, phases_s: p.phases, spans_s: p.spans, exposed_s: p.exposed, busy_s: p.busy });
  const named = new Set(["step_time_s", "tokens_per_s", "phases", "spans", "exposed", "busy"]);
  for (const [k, v] of Object.entries(p)) if (!named.has(k) && !MEMORY_FIGURES.has(k) && !isEmpty(v)) out[k] = v;
  return Object.keys(out).length ? out : null;
}

/** Memory fit: the prediction's peaks against the job's budgets (the plan's `job`), and whether the plan fits. */
function memoryOf(plan: PlanAnswer): Obj | null {
  const pred: Partial<Prediction> = plan.predicted ?? {};
  const job: Obj = plan.job ?? {};
  const out = present({
    hbm_peak_gib: pred.hbm_peak_gib,
    hbm_budget_gib: job.hbm_budget_gib,
    host_ram_gib: pred.host_ram_gib,
    host_limit_gib: job.host_limit_gib,
    host_limit_source: job.host_limit_source,
    hbm_parts_gib: pred.hbm_parts_gib,
    host_parts_gib: pred.host_parts_gib,
  });
  if (Object.keys(out).length === 0) return null;
  return { fits: typeof plan.fits === "boolean" ? plan.fits : plan.feasible, ...out };
}

/** One candidate as a table row: its policy's choices, then what it is predicted to cost. */
export function candidateRow(c: Candidate): Obj {
  const pred = c.predicted;
  return {
    ...c.policy,
    step_time_s: pred.step_time_s,
    tokens_per_s: pred.tokens_per_s,
    exposed_s: isEmpty(pred.exposed) ? null : pred.exposed,
    hbm_peak_gib: pred.hbm_peak_gib,
    host_ram_gib: pred.host_ram_gib,
    fits: c.fits,
    why_not: c.why_not,
  };
}

/** Whether a candidate is the plan's policy: every choice the candidate names is the policy's. */
export function isPlanPolicy(c: Candidate, policy: Plan["policy"]): boolean {
  if (!policy) return false;
  const chosen: Obj = { ...policy };
  return Object.entries(c.policy).every(([k, v]) => same(v, chosen[k]));
}

/** The paper's marginal pipeline cost per layer, tau_j = tau_0 + T_j k_j - T_0 k_j, as rows by activation policy. */
export function marginalRows(m: Marginal): Obj[] {
  const names = [...new Set([...Object.keys(m.tau_s ?? {}), ...Object.keys(m.delta_s ?? {}), ...Object.keys(m.T_s_per_GB ?? {})])];
  // in words, not the paper's symbols (tau, T_j): the page never introduces them
  return names.map((n) => present({ policy: n, cost_per_layer_s: m.tau_s?.[n], change_vs_recompute_s: m.delta_s?.[n], transfer_s_per_GB: m.T_s_per_GB?.[n] }));
}

// Keys with a place of their own; the others are listed under "Details".
// `validation` is in `problems` (the runtime's findings among what blocks the job).
const SHOWN = new Set(["feasible", "policy", "predicted", "candidates", "marginal", "why", "errors", "stage", "problems", "warnings", "fits", "validation", "calibration_match", "prediction_check"]);

/** What the plan panel shows, read from the documented plan JSON. */
export interface PlanView {
  problems: string[]; // what blocks the job (the preview's problems, then the planner's own errors), each once
  blocked: boolean; // the job would be refused as it is (the preview has problems)
  warnings: string[];
  why: string | null;
  asRun: boolean; // a job's policy after its run: `policy` is the one the engine ran
  checked: string | null; // after a run: its steady steps against the prediction, in words
  feasible: boolean;
  policy: Obj | null;
  prediction: Obj | null;
  memory: Obj | null;
  candidates: Obj[];
  chosen: boolean[]; // per candidate: it is the plan's policy
  marginal: { facts: Obj; rows: Obj[] } | null;
  details: Obj;
}

export function readPlan(plan: PlanAnswer): PlanView {
  const candidates = plan.candidates ?? [];
  const details: Obj = {};
  for (const [k, v] of Object.entries(plan)) if (!SHOWN.has(k) && !isEmpty(v)) details[k] = v;
  const blocking = plan.problems ?? [];
  const problems = [...new Set([...blocking, ...(plan.errors ?? [])].map(said))];
  return {
    problems,
    blocked: blocking.length > 0,
    warnings: [...new Set((plan.warnings ?? []).map(said))],
    why: typeof plan.why === "string" && plan.why.trim() ? plan.why : null,
    asRun: plan.stage === "resolved",
    checked: plan.stage === "resolved" && typeof plan.prediction_check?.message === "string" ? plan.prediction_check.message : null,
    feasible: blocking.length ? false : plan.feasible, // never feasible while something blocks the job
    policy: plan.policy ? { ...plan.policy } : null,
    prediction: predictionOf(plan.predicted),
    memory: memoryOf(plan),
    candidates: candidates.map(candidateRow),
    chosen: candidates.map((c) => isPlanPolicy(c, plan.policy)),
    marginal: plan.marginal ? { facts: present({ recompute_cost_per_layer_s: plan.marginal.tau_0_s, activation_bytes_per_layer: plan.marginal.k_bytes }), rows: marginalRows(plan.marginal) } : null,
    details,
  };
}

function badge(ok: boolean, yes: string, no: string): HTMLElement {
  return h("span", { class: ok ? "badge ok" : "badge bad" }, ok ? yes : no);
}

/** The plan preview / a job's policy: problems, warnings, why, policy, prediction, memory fit, candidates, marginal
 *  cost. */
export function renderPlan(plan: PlanAnswer | null, opts: { title?: string } = {}): HTMLElement {
  const box = h("section", { class: "plan", "aria-label": opts.title ?? "Plan" });
  if (!isObj(plan)) {
    box.append(h("p", { class: "muted" }, "No plan was returned."));
    return box;
  }
  const v = readPlan(plan);
  if (v.problems.length) {
    const heading = v.blocked ? "This job cannot run as it is:" : "The plan found problems:";
    box.append(h("div", { class: "error-box plan-problems", role: "alert" }, h("strong", null, heading), h("ul", null, v.problems.map((p) => h("li", null, p))), renderWaysOut(plan)));
  }
  if (v.warnings.length) {
    box.append(h("div", { class: "warn-box plan-warnings", role: "status" }, h("strong", null, "Warnings:"), h("ul", null, v.warnings.map((p) => h("li", null, p)))));
  }
  if (v.checked) box.append(h("h3", null, "The run against its prediction"), h("p", { class: "prediction-check" }, v.checked));
  // a plan for a declared host (a profile) says so before its verdict: nothing in it was measured
  const declared = renderDeclared(plan);
  if (declared) box.append(declared);
  // At a glance (a plan, not a job's policy as run: its prediction is of the plan made at submit time): the
  // verdict, the alternatives compared, memory as bars. The full figures follow.
  const glance = !v.asRun && v.policy;
  if (glance) {
    const verdict = renderVerdict(plan);
    if (verdict) {
      box.append(h("h3", null, "Verdict ", typeof v.feasible === "boolean" ? badge(v.feasible, "feasible", "not feasible") : null));
      if (v.blocked) box.append(h("p", { class: "muted" }, "What the job would run with once the problems above are solved."));
      box.append(verdict);
    }
  }
  // which calibration priced the plan (a job's policy as run keeps the one of its submit-time plan, not said here)
  const cal = v.asRun || declared ? null : renderCalibrationLine(plan);
  if (cal) box.append(cal);
  if (glance) {
    const alts = renderAlternatives(plan);
    if (alts) box.append(h("h3", null, "Alternatives"), alts);
  }
  const bars = glance ? renderMemoryBars(plan) : null;
  if (bars) box.append(h("h3", null, "Memory fit ", typeof v.memory?.fits === "boolean" ? badge(v.memory.fits, "fits", "does not fit") : null), bars);
  const sweep = v.asRun ? null : renderCardSweep(plan);
  if (sweep) box.append(h("h3", null, "What a different card would buy"), sweep);
  const step = glance ? renderStep(plan) : null;
  if (step) box.append(h("h3", null, "One step"), step);
  // Why: one sentence per decision with its reason in numbers; the planner's own notes and every figure behind
  // them go under Details, folded.
  const reasons = renderDecisions(plan);
  if (reasons) box.append(h("h3", null, "Why"), reasons);
  const outer = box;
  const more = h("details", { class: "plan-details" }, h("summary", null, "Details: the planner's notes, policy, figures and candidates"));
  const fold = !!reasons;
  const target = fold ? more : box;
  if (fold) outer.append(more);
  fillDetails(target, plan, v, glance, bars, reasons ? null : v.why);
  return outer;
}

/** Everything below the glance: the planner's notes (its own `why`), the policy, prediction, memory figures,
 *  candidates and the marginal cost per layer, then the other keys and the raw JSON. */
function fillDetails(box: HTMLElement, plan: PlanAnswer, v: PlanView, glance: unknown, bars: HTMLElement | null, whyHeading: string | null): void {
  if (whyHeading) box.append(h("h3", null, "Why"), h("p", { class: "why" }, whyHeading));
  else if (v.why) box.append(h("h3", null, "The planner's notes"), h("p", { class: "why" }, v.why));
  box.append(h("h3", null, v.asRun ? "Policy as run" : "Chosen policy", " ", typeof v.feasible === "boolean" && !glance ? badge(v.feasible, "feasible", "not feasible") : null));
  if (v.policy) {
    if (v.asRun) box.append(h("p", { class: "muted" }, "What the engine ran. The prediction and candidates are the plan made when the job was submitted."));
    if (v.blocked && !glance) box.append(h("p", { class: "muted" }, "What the job would run with once the problems above are solved."));
    box.append(kvList(v.policy));
  } else box.append(h("p", { class: "muted" }, "No policy: the plan is not feasible (the problems above say why)."));
  if (v.prediction) box.append(h("h3", null, "Predicted"), kvList(v.prediction, new Set(), true));
  if (v.memory) {
    const { fits, ...figures } = v.memory;
    if (bars) box.append(h("details", { class: "memory-figures" }, h("summary", null, "Memory figures"), kvList(figures, new Set(), true)));
    else box.append(h("h3", null, "Memory fit ", typeof fits === "boolean" ? badge(fits, "fits", "does not fit") : null), kvList(figures, new Set(), true));
  }
  if (v.candidates.length) {
    // Columns that are the same for every candidate are said once; the table shows what varies.
    const flat = v.candidates;
    const common: Obj = {};
    if (flat.length > 1) {
      for (const k of Object.keys(flat[0])) {
        if (flat.every((r) => same(r[k], flat[0][k])) && !isEmpty(flat[0][k])) common[k] = flat[0][k];
      }
    }
    const varying = flat.map((r) => {
      const out: Obj = {};
      for (const [k, x] of Object.entries(r)) if (!(k in common)) out[k] = x;
      return out;
    });
    const table = objectTable(varying, undefined, `${flat.length} candidate polic${flat.length === 1 ? "y" : "ies"}`);
    const parts = [Object.keys(common).length ? h("div", { class: "muted" }, h("span", null, `Common to all ${flat.length}:`), kvList(common)) : "", table];
    // With the alternatives above, every candidate as planned is one click away.
    if (glance) box.append(h("details", { class: "all-candidates" }, h("summary", null, `Every candidate as planned (${flat.length})`), ...parts));
    else box.append(h("h3", null, "Candidates"), ...parts);
    // Highlight the plan's policy (rows keep the candidates' order).
    const rows = table.querySelectorAll<HTMLTableRowElement>("tbody tr");
    v.chosen.forEach((chosen, i) => {
      if (chosen) rows[i]?.classList.add("chosen-row");
    });
  } else if (Array.isArray(plan.candidates)) {
    box.append(h("h3", null, "Candidates"), h("p", { class: "muted" }, "No candidates were compared."));
  }
  if (v.marginal) {
    box.append(
      h("h3", null, "What one more layer costs, by where its activations go"),
      h(
        "p",
        { class: "muted" },
        "The planner weighs each layer's activations by what it adds to the step in the running pipeline: the cost of a layer that recomputes them (the base), the change if it keeps or offloads them instead, and the transfer time per GB each choice adds. The activation bytes one layer saves is what keeping it costs in GPU memory.",
      ),
      h("div", null, Object.keys(v.marginal.facts).length ? kvList(v.marginal.facts) : null, v.marginal.rows.length ? objectTable(v.marginal.rows, undefined, "per layer, in the running pipeline") : null),
    );
  }
  if (Object.keys(v.details).length) box.append(h("h3", null, "Other fields"), kvList(v.details, new Set(), true));
  box.append(h("details", { class: "raw" }, h("summary", null, "Raw JSON"), h("pre", null, JSON.stringify(plan, null, 2))));
}

/** Which stored calibration priced the plan, or why none of the host's could and the command that measures the
 *  job's shape (the API's `calibration_match`); a plan without one says nothing here. */
export function renderCalibrationLine(plan: PlanAnswer): HTMLElement | null {
  const m = matchWords(plan.calibration_match, plan.calibration_note);
  if (!m) return null;
  // a record that matched but lacked a figure the planner needs: the planner's own words say which
  const unusable = m.used && plan.calibration === "missing" && plan.calibration_note ? ` The planner could not use it: ${plan.calibration_note}.` : "";
  return h(
    "div",
    { class: `plan-calibration ${m.used && !unusable ? "cal-used" : "cal-unused"}`, "data-part": "calibration" },
    h("p", null, m.text + unusable, m.key ? [" ", h("a", { href: `/hosts?calibration=${encodeURIComponent(m.key)}` }, "See it on the Hosts page.")] : null),
    m.reasons.length ? h("ul", { class: "cal-reasons" }, m.reasons.map((r) => h("li", null, r))) : null,
    m.run ? h("p", null, "To predict step times, measure this shape on the host: ", h("code", { class: "cal-run" }, m.run)) : null,
  );
}
