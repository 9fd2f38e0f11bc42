// Curves of several jobs on one step axis (the compare page, pages/compare.ts): which jobs a compare URL names,
// where a resumed job's attempts join, and the aligned columns the chart draws. No DOM here.
import { isNonFinite, pickIndices } from "./series";
import type { MetricsRecord } from "./types";

/** Lines a chart can tell apart by colour (the palette's length). */
export const MAX_COMPARED = 10;

export interface Selection {
  /** Job ids in the order the URL names them, each once. */
  ids: number[];
  /** What in the URL is not a job id, or is left out, in words. */
  problems: string[];
  /** The axes the person chose, by URL parameter (`log`: the loss chart, `log_grad_norm`, ...): true for a log
   *  axis, false for a linear one; a chart not named here picks its axis itself (comparison.ts). */
  scales: Record<string, boolean>;
}

/** The URL parameters that keep a chart's explicit axis choice, "1" log and "0" linear (comparison.ts charts). */
export const SCALE_PARAMS = ["log", "log_grad_norm", "log_step_time", "log_tokens"] as const;

/**
 * The comparison a URL's query names: `?ids=3,5` (comma-separated job ids), and `log=1` (`log=0`) for a log (linear)
 * loss axis, likewise `log_grad_norm`, `log_step_time`, `log_tokens` for the other charts. The
 * selection lives in the URL so a reload or a shared link shows the same comparison; anything that is not a
 * job id is named in `problems`, never silently dropped.
 */
export function parseSelection(search: string): Selection {
  const params = new URLSearchParams(search);
  const raw = params.getAll("ids").join(",");
  const ids: number[] = [];
  const problems: string[] = [];
  for (const part of raw.split(",")) {
    const token = part.trim();
    if (!token) continue;
    const id = /^\d+$/.test(token) ? Number(token) : NaN;
    if (!Number.isSafeInteger(id) || id < 1) {
      problems.push(`"${token.length > 40 ? token.slice(0, 40) + "…" : token}" is not a job id (a whole number from 1).`);
      continue;
    }
    if (!ids.includes(id)) ids.push(id);
  }
  if (ids.length > MAX_COMPARED) {
    problems.push(`At most ${MAX_COMPARED} jobs are compared at once: jobs ${ids.slice(MAX_COMPARED).map((i) => `#${i}`).join(", ")} are left out.`);
    ids.length = MAX_COMPARED;
  }
  const scales: Record<string, boolean> = {};
  for (const name of SCALE_PARAMS) {
    const v = params.get(name);
    if (v === "1" || v === "0") scales[name] = v === "1";
  }
  return { ids, problems, scales };
}

/** The compare page's URL for these jobs and the axes chosen explicitly (a chart left out picks its own). */
export function compareHref(ids: readonly number[], scales: Readonly<Record<string, boolean>> = {}): string {
  const chosen = SCALE_PARAMS.filter((p) => p in scales).map((p) => `&${p}=${scales[p] ? 1 : 0}`);
  return `/jobs/compare?ids=${ids.join(",")}${chosen.join("")}`;
}

/**
 * Steps at which a later attempt of a job took over: the first record of every run of the runtime carries
 * `startup_s` (docs/interfaces.md §3), and a resumed attempt is a new run that starts after its checkpoint's
 * step. `records` are unique by step and in step order (MetricsStore): a repeated step holds the newer attempt's
 * record, so the curve is one line and these are the joins.
 */
export function resumeSteps(records: readonly MetricsRecord[]): number[] {
  const out: number[] = [];
  records.forEach((r, i) => {
    if (i > 0 && r.startup_s !== undefined && r.startup_s !== null) out.push(r.step);
  });
  return out;
}

/** The finite numbers of a key, null elsewhere (a NaN loss stored as null is a gap, not a zero). */
function finite(v: unknown, positive: boolean): number | null {
  return typeof v === "number" && Number.isFinite(v) && (!positive || v > 0) ? v : null;
}

/** What an overlay chart draws: one shared step axis and, per job, columns aligned with it. */
export interface Overlay {
  /** The union of every job's steps that is drawn, ascending. */
  steps: number[];
  /** Per job: the metric at each drawn step (null where it has none: before its start, after its end). */
  values: (number | null)[][];
  /** Per job: the metric's eval counterpart (eval loss) at the steps it evaluated after, null elsewhere. */
  evalValues: (number | null)[][];
  /** Per job: whether it has any eval value (so an eval line is drawn for it). */
  hasEval: boolean[];
  /** Per job: the steps its later attempts resumed at (resumeSteps). */
  resumes: number[][];
  /** Per job: its newest step with a finite value, and that value (the legend's value off the chart). */
  last: ({ step: number; value: number } | null)[];
  /** Per job: the first step whose value was not finite (NaN, ±inf, or null as metrics.jsonl writes them). */
  nonFinite: (number | null)[];
}

/**
 * Align several jobs' records of one metric (`key`, default loss, with `evalKey`, default eval_loss when the key
 * is loss) on one step axis. Each job's records must be unique by step and in step order
 * (MetricsStore). With `log`, values that a log axis cannot place (<= 0) are gaps. Beyond `maxPoints` steps the
 * axis is downsampled as the job page's charts are (series.ts pickIndices: per bucket every job's minimum,
 * maximum and first gap survive, and the newest step), keeping every eval step while they are few and every
 * resume step.
 */
export function overlay(runs: readonly (readonly MetricsRecord[])[], opts: { key?: string; evalKey?: string | null; log?: boolean; maxPoints?: number } = {}): Overlay {
  const key = opts.key ?? "loss";
  const evalKey = opts.evalKey !== undefined ? opts.evalKey : key === "loss" ? "eval_loss" : null;
  const positive = !!opts.log;
  const maxPoints = opts.maxPoints ?? 3000;
  const all = new Set<number>();
  for (const recs of runs) for (const r of recs) if (typeof r.step === "number" && Number.isFinite(r.step)) all.add(r.step);
  const steps = Array.from(all).sort((a, b) => a - b);
  const at = new Map(steps.map((s, i) => [s, i]));
  const loss = runs.map(() => new Array<number | null>(steps.length).fill(null));
  const evalLoss = runs.map(() => new Array<number | null>(steps.length).fill(null));
  const last: Overlay["last"] = runs.map(() => null);
  const nonFinite: Overlay["nonFinite"] = runs.map(() => null);
  runs.forEach((recs, k) => {
    for (const r of recs) {
      const i = at.get(r.step);
      if (i === undefined) continue;
      loss[k][i] = finite(r[key], positive);
      if (evalKey) evalLoss[k][i] = finite(r[evalKey], positive);
      const l = finite(r[key], false);
      if (l !== null) last[k] = { step: r.step, value: l };
      else if (nonFinite[k] === null && isNonFinite(r, key)) nonFinite[k] = r.step;
    }
  });
  const resumes = runs.map((recs) => resumeSteps(recs));
  const hasEval = evalLoss.map((c) => c.some((v) => v !== null));

  let idx = pickIndices(steps.length, loss, maxPoints);
  if (idx.length < steps.length) {
    const evalIdx = evalLoss.flatMap((c) => c.flatMap((v, i) => (v !== null ? [i] : [])));
    const keep = resumes.flat().map((s) => at.get(s) as number);
    if (evalIdx.length <= maxPoints / 2) keep.push(...evalIdx);
    idx = Array.from(new Set([...idx, ...keep])).sort((a, b) => a - b);
  }
  const pick = (c: (number | null)[]) => (idx.length === steps.length ? c : idx.map((i) => c[i]));
  return {
    steps: idx.length === steps.length ? steps : idx.map((i) => steps[i]),
    values: loss.map(pick),
    evalValues: evalLoss.map(pick),
    hasEval,
    resumes,
    last,
    nonFinite,
  };
}
