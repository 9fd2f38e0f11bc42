// The AutoPolicy plan (POST /api/plan, docs/interfaces.md §5) and a job's resolved policy, shown as they are:
// known parts get their own place (chosen policy, candidate table, memory fit, the why), everything else is
// listed under its own name, and nothing absent is filled in.
import { h } from "./dom";
import { bytes, gbps, gib, isNum, num, percent, seconds, words } from "./fmt";

type Obj = Record<string, unknown>;

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
    if (k.endsWith("_s") || k === "s" || k.endsWith("seconds")) return seconds(v);
    if (k.endsWith("_gib") || k === "gib") return gib(v);
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

/** A table of objects: one row each, one column per key (in first-seen order). */
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

function whyOf(o: Obj): string[] {
  const w = o.why ?? o.reason ?? o.reasons ?? o.explanation;
  if (typeof w === "string" && w.trim()) return [w];
  if (Array.isArray(w)) return w.map((x) => (typeof x === "string" ? x : JSON.stringify(x)));
  return [];
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

// Keys of a policy the runtime resolved (a job's policy carries them at the top level, next to its plan).
const RESOLVED = ["stage", "delivery", "grad_reduce", "reduce_dtype", "delivery_cast", "edge_update", "device_layers", "activations", "resident", "keep_layers", "offload_layers", "resident_units", "window", "chunk_mb", "loss_chunk_tokens", "staging_slots"];

function resolvedOf(o: Obj): Obj | null {
  const out: Obj = {};
  for (const k of RESOLVED) if (k in o) out[k] = o[k];
  return "delivery" in out || "activations" in out ? out : null;
}

/** The policy the plan chose: an explicit `chosen`, or `policy` when the plan compared candidates. */
function chosenOf(o: Obj): { title: string; policy: Obj } | null {
  for (const k of ["chosen", "choice", "selected"]) if (isObj(o[k])) return { title: "Chosen policy", policy: o[k] as Obj };
  if (!isObj(o.policy)) return null;
  const planned = "candidates" in o || "feasible" in o;
  return { title: planned ? "Chosen policy" : "Policy", policy: o.policy as Obj };
}

/** Memory fit: an explicit section, else the prediction's peaks against the job's budgets. */
function memoryOf(o: Obj): Obj | null {
  for (const k of ["memory", "memory_fit", "fit"]) if (isObj(o[k])) return o[k] as Obj;
  const pred = isObj(o.predicted) ? (o.predicted as Obj) : {};
  const job = isObj(o.job) ? (o.job as Obj) : {};
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
  if (typeof o.feasible === "boolean") out.fits = o.feasible;
  return out;
}

/** The prediction without the memory parts (those are under memory fit). */
function predictionOf(o: Obj): Obj | null {
  if (!isObj(o.predicted)) return null;
  const p = o.predicted as Obj;
  const out = present({ step_time_s: p.step_time_s, tokens_per_s: p.tokens_per_s, phases_s: p.phases, exposed_s: p.exposed, busy_s: p.busy });
  for (const [k, v] of Object.entries(p)) {
    if (!["step_time_s", "tokens_per_s", "phases", "exposed", "busy", "hbm_peak_gib", "host_ram_gib", "hbm_parts_gib", "host_parts_gib"].includes(k) && !isEmpty(v)) out[k] = v;
  }
  return Object.keys(out).length ? out : null;
}

/** One candidate as a table row: its policy's choices, then what it is predicted to cost. */
function candidateRow(c: Obj): Obj {
  if (!isObj(c.policy) && !isObj(c.predicted)) return c;
  const pol = isObj(c.policy) ? (c.policy as Obj) : {};
  const pred = isObj(c.predicted) ? (c.predicted as Obj) : {};
  const row: Obj = {};
  for (const [k, v] of Object.entries(c)) if (k !== "policy" && k !== "predicted" && !["fits", "why_not"].includes(k)) row[k] = v;
  Object.assign(row, pol, {
    step_time_s: pred.step_time_s,
    tokens_per_s: pred.tokens_per_s,
    exposed_s: isEmpty(pred.exposed) ? null : pred.exposed,
    hbm_peak_gib: pred.hbm_peak_gib,
    host_ram_gib: pred.host_ram_gib,
    fits: c.fits,
    why_not: c.why_not,
  });
  return row;
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

function isChosenCandidate(c: Obj, chosen: Obj | null): boolean {
  if (c.chosen === true || c.selected === true) return true;
  if (!chosen) return false;
  if (isObj(c.policy)) return same(c.policy, chosen);
  const name = c.name ?? c.label ?? c.id;
  return name !== undefined && name === (chosen.name ?? chosen.label ?? chosen.id);
}

/** The paper's marginal pipeline cost per layer, tau_j = tau_0 + T_j k_j - T_0 k_j, as a table by policy. */
function marginalTable(m: Obj): HTMLElement | null {
  const tau = isObj(m.tau_s) ? (m.tau_s as Obj) : {};
  const delta = isObj(m.delta_s) ? (m.delta_s as Obj) : {};
  const T = isObj(m.T_s_per_GB) ? (m.T_s_per_GB as Obj) : {};
  const names = [...new Set([...Object.keys(tau), ...Object.keys(delta), ...Object.keys(T)])];
  if (!names.length) return null;
  const rows = names.map((n) => present({ policy: n, tau_s: tau[n], change_vs_base_s: delta[n], T_s_per_GB: T[n] }));
  const facts = present({ tau_0_s: m.tau_0_s, k_bytes: m.k_bytes });
  return h("div", null, Object.keys(facts).length ? kvList(facts) : null, objectTable(rows, undefined, "per layer, in the running pipeline"));
}

const SHOWN = new Set(["marginal", "chosen", "choice", "selected", "policy", "candidates", "memory", "memory_fit", "fit", "why", "reason", "reasons", "explanation", "predicted", "feasible", "errors"]);

/** The plan preview / a job's policy: why, chosen (and as-run) policy, prediction, memory fit, candidates. */
export function renderPlan(given: unknown, opts: { title?: string } = {}): HTMLElement {
  const box = h("section", { class: "plan", "aria-label": opts.title ?? "Plan" });
  if (!isObj(given)) {
    box.append(h("p", { class: "muted" }, "No plan was returned."));
    return box;
  }
  // A job's policy is the runtime's resolved policy with the plan it came from nested under "plan" (often
  // also spread at the top): read them as one, the top level (what ran) winning.
  let plan: Obj = given;
  if (isObj(given.plan)) {
    const { plan: inner, ...top } = given;
    plan = { ...(inner as Obj), ...top };
  }
  const chosen = chosenOf(plan);
  const resolved = resolvedOf(plan);
  const why = whyOf(plan);
  const prediction = predictionOf(plan);
  const memory = memoryOf(plan);
  const candidates = Array.isArray(plan.candidates) ? plan.candidates.filter(isObj) : [];
  const errors = Array.isArray(plan.errors) ? plan.errors : [];

  if (errors.length) {
    box.append(h("div", { class: "error-box", role: "alert" }, h("strong", null, "The plan found problems:"), h("ul", null, errors.map((e) => h("li", null, typeof e === "string" ? e : isObj(e) && "msg" in e ? `${String(e.loc ?? "")}: ${String(e.msg)}` : JSON.stringify(e))))));
  }
  if (why.length) {
    box.append(h("h3", null, "Why"), why.length === 1 ? h("p", { class: "why" }, why[0]) : h("ul", { class: "why" }, why.map((w) => h("li", null, w))));
  }
  if (chosen) {
    const feasible = plan.feasible;
    box.append(
      h("h3", null, chosen.title, " ", typeof feasible === "boolean" ? h("span", { class: feasible ? "badge ok" : "badge bad" }, feasible ? "feasible" : "not feasible") : null),
      kvList(chosen.policy, new Set(["why", "reason", "reasons"])),
    );
  }
  if (resolved) box.append(h("h3", null, "As run"), kvList(resolved));
  if (prediction) box.append(h("h3", null, "Predicted"), kvList(prediction, new Set(), true));
  if (memory) {
    const fits = memory.fits ?? memory.fit ?? memory.ok;
    box.append(
      h("h3", null, "Memory fit ", typeof fits === "boolean" ? h("span", { class: fits ? "badge ok" : "badge bad" }, fits ? "fits" : "does not fit") : null),
      kvList(memory, new Set(), true),
    );
  }
  if (candidates.length) {
    // Columns that are the same for every candidate are said once; the table shows what varies.
    const flat = candidates.map(candidateRow);
    const common: Obj = {};
    if (flat.length > 1) {
      for (const k of Object.keys(flat[0])) {
        if (flat.every((r) => same(r[k], flat[0][k])) && !isEmpty(flat[0][k])) common[k] = flat[0][k];
      }
    }
    const varying = flat.map((r) => {
      const out: Obj = {};
      for (const [k, v] of Object.entries(r)) if (!(k in common)) out[k] = v;
      return out;
    });
    box.append(
      h("h3", null, "Candidates"),
      Object.keys(common).length ? h("div", { class: "muted" }, h("span", null, `Common to all ${flat.length}:`), kvList(common)) : "",
      objectTable(varying, (_r) => false, `${candidates.length} candidate polic${candidates.length === 1 ? "y" : "ies"}`),
    );
    // Highlight the chosen row (rows keep the candidates' order).
    const rows = box.querySelectorAll<HTMLTableRowElement>("table.data-table tbody tr");
    candidates.forEach((c, i) => {
      if (isChosenCandidate(c, chosen?.policy ?? null)) rows[i]?.classList.add("chosen-row");
    });
  } else if (Array.isArray(plan.candidates)) {
    box.append(h("h3", null, "Candidates"), h("p", { class: "muted" }, "No candidates were compared."));
  }
  if (isObj(plan.marginal)) {
    const table = marginalTable(plan.marginal as Obj);
    box.append(h("h3", null, "Marginal cost per layer (τ)"), table ?? kvList(plan.marginal as Obj, new Set(), true));
  }
  const rest: Obj = {};
  for (const [k, v] of Object.entries(plan)) if (!SHOWN.has(k) && !(resolved && k in resolved) && !isEmpty(v)) rest[k] = v;
  if (Object.keys(rest).length) box.append(h("h3", null, "Details"), kvList(rest, new Set(), true));
  box.append(h("details", { class: "raw" }, h("summary", null, "Raw JSON"), h("pre", null, JSON.stringify(plan, null, 2))));
  return box;
}
