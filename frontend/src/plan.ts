// The AutoPolicy plan (POST /api/plan, docs/interfaces.md §5) and a job's resolved policy, shown as they are:
// known parts get their own place (chosen policy, candidate table, memory fit, the why), everything else is
// listed under its own name, and nothing absent is filled in.
import { h } from "./dom";
import { bytes, gbps, gib, isNum, num, percent, seconds, words } from "./fmt";

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const UNIT = /_(s|gib|bytes|gbps|gb_s)$/;

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

/** A two-column list of an object's entries; nested objects become nested lists. */
export function kvList(obj: Obj, skip: ReadonlySet<string> = new Set()): HTMLElement {
  const dl = h("dl", { class: "facts" });
  for (const [k, v] of Object.entries(obj)) {
    if (skip.has(k) || v === undefined) continue;
    let dd: Node;
    if (isObj(v) && Object.values(v).some((x) => isObj(x) || Array.isArray(x))) dd = kvList(v);
    else if (Array.isArray(v) && v.some(isObj)) dd = objectTable(v.filter(isObj));
    else dd = document.createTextNode(fmtByKey(k, v));
    dl.append(h("dt", null, words(k)), h("dd", null, dd));
  }
  return dl;
}

/** A table of objects: one row each, one column per key (in first-seen order). */
export function objectTable(rows: Obj[], highlight?: (row: Obj) => boolean, caption?: string): HTMLElement {
  const cols: string[] = [];
  for (const r of rows) for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "data-table" },
      caption ? h("caption", null, caption) : null,
      h("thead", null, h("tr", null, cols.map((c) => h("th", { scope: "col" }, words(c))))),
      h(
        "tbody",
        null,
        rows.map((r) =>
          h(
            "tr",
            { class: highlight?.(r) ? "chosen-row" : undefined },
            cols.map((c) => h("td", { class: isNum(r[c]) ? "num" : undefined }, fmtByKey(c, r[c]))),
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

function memoryOf(o: Obj): Obj | null {
  for (const k of ["memory", "memory_fit", "fit"]) if (isObj(o[k])) return o[k] as Obj;
  return null;
}

function chosenOf(o: Obj): Obj | null {
  for (const k of ["chosen", "choice", "selected"]) if (isObj(o[k])) return o[k] as Obj;
  return null;
}

// Keys of a policy the runtime resolved (a job's policy carries them at the top level, next to the plan).
const RESOLVED = ["stage", "delivery", "grad_reduce", "reduce_dtype", "activations", "resident", "keep_layers", "offload_layers", "resident_units", "window", "chunk_mb", "loss_chunk_tokens", "staging_slots"];

function resolvedOf(o: Obj): Obj | null {
  const out: Obj = {};
  for (const k of RESOLVED) if (k in o) out[k] = o[k];
  return "delivery" in out || "activations" in out ? out : null;
}

function isEmpty(v: unknown): boolean {
  return v === null || v === undefined || (isObj(v) && Object.keys(v).length === 0) || (Array.isArray(v) && v.length === 0);
}

function sameCandidate(a: Obj, chosen: Obj | null, chosenName: unknown): boolean {
  if (a.chosen === true || a.selected === true) return true;
  const name = a.name ?? a.label ?? a.id;
  if (name !== undefined && chosenName !== undefined && name === chosenName) return true;
  return chosen !== null && a === chosen;
}

const SHOWN = new Set(["chosen", "choice", "selected", "policy", "candidates", "memory", "memory_fit", "fit", "why", "reason", "reasons", "explanation", "predicted"]);

/** The plan preview / a job's policy: why, chosen (or resolved) policy, memory fit, candidate table. */
export function renderPlan(plan: unknown, opts: { title?: string } = {}): HTMLElement {
  const box = h("section", { class: "plan", "aria-label": opts.title ?? "Plan" });
  if (!isObj(plan)) {
    box.append(h("p", { class: "muted" }, "No plan was returned."));
    return box;
  }
  const chosen = chosenOf(plan);
  const resolved = chosen ? null : resolvedOf(plan);
  const configured = isObj(plan.policy) ? (plan.policy as Obj) : null;
  const why = whyOf(plan).concat(chosen ? whyOf(chosen) : []);
  const memory = memoryOf(plan) ?? (chosen ? memoryOf(chosen) : null);
  const candidates = Array.isArray(plan.candidates) ? plan.candidates.filter(isObj) : [];
  const chosenName = chosen ? (chosen.name ?? chosen.label ?? chosen.id) : (plan.name ?? undefined);
  const skipInChosen = new Set(["why", "reason", "reasons", "memory", "memory_fit", "fit"]);

  if (why.length) {
    box.append(h("h3", null, "Why"), why.length === 1 ? h("p", { class: "why" }, why[0]) : h("ul", { class: "why" }, why.map((w) => h("li", null, w))));
  }
  if (chosen) box.append(h("h3", null, "Chosen policy"), kvList(chosen, skipInChosen));
  if (resolved) box.append(h("h3", null, "Resolved policy"), kvList(resolved));
  if (configured) box.append(h("h3", null, chosen || resolved ? "Configured policy" : "Policy"), kvList(configured));
  if (isObj(plan.predicted) && !isEmpty(plan.predicted)) box.append(h("h3", null, "Predicted"), kvList(plan.predicted as Obj));
  if (memory) {
    const fits = memory.fits ?? memory.fit ?? memory.ok;
    box.append(
      h("h3", null, "Memory fit ", typeof fits === "boolean" ? h("span", { class: fits ? "badge ok" : "badge bad" }, fits ? "fits" : "does not fit") : null),
      kvList(memory),
    );
  }
  if (candidates.length) {
    box.append(h("h3", null, "Candidates"), objectTable(candidates, (c) => sameCandidate(c, chosen, chosenName), `${candidates.length} candidate policies`));
  } else if (Array.isArray(plan.candidates)) {
    box.append(h("h3", null, "Candidates"), h("p", { class: "muted" }, "No candidates were compared."));
  }
  const rest: Obj = {};
  for (const [k, v] of Object.entries(plan)) if (!SHOWN.has(k) && !(resolved && k in resolved) && !isEmpty(v)) rest[k] = v;
  if (Object.keys(rest).length) box.append(h("h3", null, "Details"), kvList(rest));
  box.append(h("details", { class: "raw" }, h("summary", null, "Raw JSON"), h("pre", null, JSON.stringify(plan, null, 2))));
  return box;
}
