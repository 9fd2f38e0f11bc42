// The whole run's metrics, kept in step order, and the subset of points a chart draws.
// Stored points are never dropped: a chart of a 100k-step run draws a few thousand of them, chosen so that
// spikes, NaN losses and the newest step stay visible.
import type { MetricsRecord } from "./types";

/** Metrics records of one job, unique by step and sorted. A repeated step (a resumed run re-doing steps
 *  after its newest checkpoint) replaces the older record. */
export class MetricsStore {
  readonly records: MetricsRecord[] = [];

  get length(): number {
    return this.records.length;
  }

  get lastStep(): number {
    return this.records.length ? this.records[this.records.length - 1].step : 0;
  }

  /** Add one record; returns false when it was not a usable record. */
  add(rec: MetricsRecord): boolean {
    if (!rec || typeof rec.step !== "number" || !Number.isFinite(rec.step)) return false;
    const recs = this.records;
    if (recs.length === 0 || rec.step > recs[recs.length - 1].step) {
      recs.push(rec);
      return true;
    }
    let lo = 0;
    let hi = recs.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (recs[mid].step < rec.step) lo = mid + 1;
      else hi = mid;
    }
    if (lo < recs.length && recs[lo].step === rec.step) recs[lo] = rec;
    else recs.splice(lo, 0, rec);
    return true;
  }

  /** The last step s such that steps 1..s are all stored: where a catch-up read must start. */
  contiguousStep(): number {
    let s = 0;
    for (const r of this.records) {
      if (r.step !== s + 1) break;
      s = r.step;
    }
    return s;
  }

  addMany(recs: Iterable<MetricsRecord>): number {
    let n = 0;
    for (const r of recs) if (this.add(r)) n++;
    return n;
  }
}

/** A value is "not finite" when the key exists but holds NaN, ±Infinity or null (a NaN the server nulled). */
export function isNonFinite(rec: MetricsRecord, key: string): boolean {
  if (!(key in rec)) return false;
  const v = rec[key];
  return v === null || (typeof v === "number" && !Number.isFinite(v));
}

/** Steps whose loss is NaN/Inf (or was written as null), in order. */
export function nonFiniteLossSteps(records: readonly MetricsRecord[]): number[] {
  const out: number[] = [];
  for (const r of records) if (isNonFinite(r, "loss")) out.push(r.step);
  return out;
}

/**
 * Indices of the points to draw out of `n`, at most about `maxPoints`.
 * Per bucket of consecutive points: the first, and for every series its minimum, its maximum and its first
 * non-finite value, so peaks, dips and NaN steps survive; the last point is always drawn.
 */
export function pickIndices(n: number, series: readonly ArrayLike<number | null>[], maxPoints: number): number[] {
  if (n <= 0) return [];
  if (n <= maxPoints) return Array.from({ length: n }, (_, i) => i);
  const perBucket = 1 + 3 * Math.max(1, series.length);
  const buckets = Math.max(1, Math.floor(maxPoints / perBucket));
  const size = n / buckets;
  const chosen = new Set<number>();
  for (let b = 0; b < buckets; b++) {
    const start = Math.floor(b * size);
    const end = Math.min(n, Math.floor((b + 1) * size));
    if (start >= end) continue;
    chosen.add(start);
    for (const ys of series) {
      let lo = -1;
      let hi = -1;
      let bad = -1;
      for (let i = start; i < end; i++) {
        const v = ys[i];
        if (v === null || v === undefined) continue;
        if (!Number.isFinite(v)) {
          if (bad < 0) bad = i;
          continue;
        }
        if (lo < 0 || v < (ys[lo] as number)) lo = i;
        if (hi < 0 || v > (ys[hi] as number)) hi = i;
      }
      if (lo >= 0) chosen.add(lo);
      if (hi >= 0) chosen.add(hi);
      if (bad >= 0) chosen.add(bad);
    }
  }
  chosen.add(n - 1);
  return Array.from(chosen).sort((a, b) => a - b);
}

/** A numeric column of the records; missing values become null (a gap), NaN stays NaN. */
export function column(records: readonly MetricsRecord[], get: (r: MetricsRecord) => unknown): (number | null)[] {
  return records.map((r) => {
    const v = get(r);
    return typeof v === "number" ? v : null;
  });
}

/** Phase names in the order the step runs them, then any other phase the runtime reports, alphabetically. */
export const PHASE_ORDER = ["data", "forward", "backward", "update_tail", "delivery_wait", "staging_wait", "update_busy", "update_cast_busy", "update_offcpu"];

/**
 * How a measured phase (docs/interfaces.md §3) relates to the step's wall time:
 *  - "span": a span of the compute stream; the spans partition the step (forward + backward = the step), so they stack;
 *  - "wait": a host-side wait of the issuing thread, overlapped with queued GPU work and so inside the spans;
 *  - "overlapped": work of the updater thread running beside the step (the CPU update under backward).
 * Only spans are slices of the step; the others are drawn as lines (stacking them would count time twice).
 */
export type PhaseKind = "span" | "wait" | "overlapped";
export const PHASE_KINDS: Readonly<Record<string, PhaseKind>> = {
  forward: "span",
  backward: "span",
  data: "wait",
  update_tail: "wait",
  delivery_wait: "wait",
  staging_wait: "wait",
  update_busy: "overlapped",
  update_cast_busy: "overlapped",
  update_offcpu: "overlapped",
};

/** A phase this page does not know is drawn as a line, never stacked: it is not known to be a slice of the step. */
export function phaseKind(phase: string): PhaseKind {
  return PHASE_KINDS[phase] ?? (phase.endsWith("_busy") ? "overlapped" : "wait");
}

/** Work that overlaps the step (the updater's time and its parts): drawn as a line, never stacked. */
export function isOverlapped(phase: string): boolean {
  return phaseKind(phase) === "overlapped";
}

export function phaseNames(records: readonly MetricsRecord[]): string[] {
  const seen = new Set<string>();
  for (const r of records) {
    if (r.phases && typeof r.phases === "object") for (const k of Object.keys(r.phases)) seen.add(k);
  }
  const known = PHASE_ORDER.filter((p) => seen.has(p));
  const rest = Array.from(seen).filter((p) => !PHASE_ORDER.includes(p)).sort();
  return [...known, ...rest];
}

/** How many GPUs the records report HBM for (the widest hbm_peak_gib list). */
export function gpuCount(records: readonly MetricsRecord[]): number {
  let n = 0;
  for (const r of records) if (Array.isArray(r.hbm_peak_gib)) n = Math.max(n, r.hbm_peak_gib.length);
  return n;
}

/** Cumulative sums of stacked series (bottom first); a missing part counts as 0 within a step that has others,
 *  and the whole step is a gap when it has none. */
export function stack(parts: readonly (number | null)[][]): (number | null)[][] {
  if (parts.length === 0) return [];
  const n = parts[0].length;
  const out: (number | null)[][] = parts.map(() => new Array(n).fill(null));
  for (let i = 0; i < n; i++) {
    if (parts.every((p) => p[i] === null || !Number.isFinite(p[i] as number))) continue;
    let acc = 0;
    for (let k = 0; k < parts.length; k++) {
      const v = parts[k][i];
      if (v !== null && Number.isFinite(v)) acc += v;
      out[k][i] = acc;
    }
  }
  return out;
}

/**
 * Exponential moving average with weight w in [0, 1) (0: the values themselves), bias-corrected so the first
 * points are not pulled towards 0. Missing and non-finite values are skipped (null in the output) and do not
 * disturb the average, so a NaN step does not wipe out the smoothed curve after it.
 */
export function ema(values: readonly (number | null)[], weight: number): (number | null)[] {
  const w = Number.isFinite(weight) ? Math.min(0.999, Math.max(0, weight)) : 0;
  let acc = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return null;
    acc = acc * w + (1 - w) * v;
    n++;
    return w === 0 ? v : acc / (1 - w ** n);
  });
}

/** The y range of some columns, and the first point when it was left out of it. */
export interface Extent {
  min: number;
  max: number;
  /** The first point's most extreme value outside [min, max] when skipFirst left it out, else null. */
  first: number | null;
}

/**
 * Min and max over the columns' finite values (with `positive`, only values > 0: a log axis). With `skipFirst`
 * the first point (the warm-up step: compilation, allocation, cold caches) is left out whenever a later point
 * has a value, so one slow first step does not squash the rest of the run into the bottom of the chart.
 */
export function autoExtent(cols: readonly (readonly (number | null)[])[], skipFirst = false, positive = false): Extent | null {
  const ok = (v: number | null | undefined): v is number => v !== null && v !== undefined && Number.isFinite(v) && (!positive || v > 0);
  let min = Infinity;
  let max = -Infinity;
  for (const c of cols) {
    for (let i = skipFirst ? 1 : 0; i < c.length; i++) {
      const v = c[i];
      if (ok(v)) {
        if (v < min) min = v;
        if (v > max) max = v;
      }
    }
  }
  const firsts = cols.map((c) => c[0]).filter(ok);
  if (min > max) {
    // nothing after the first point: the first point is the range
    if (firsts.length === 0) return null;
    return { min: Math.min(...firsts), max: Math.max(...firsts), first: null };
  }
  let first: number | null = null;
  if (skipFirst && firsts.length) {
    const hi = Math.max(...firsts);
    const lo = Math.min(...firsts);
    if (hi > max) first = hi;
    else if (lo < min) first = lo;
  }
  return { min, max, first };
}

/** A linear axis range with 5 % head room; from 0 when every value is >= 0 (or when `fromZero`). */
export function linearRange(min: number | null, max: number | null, fromZero = false): [number, number] {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  const lo = fromZero || min >= 0 ? Math.min(0, min) : min;
  let hi = max;
  if (hi <= lo) hi = lo === 0 ? 1 : lo + Math.abs(lo) * 0.1;
  return [lo, hi + (hi - lo) * 0.05];
}

/** A log10 axis range: whole decades around the values (values must be > 0). */
export function logRange(min: number | null, max: number | null): [number, number] {
  if (min === null || max === null || !(min > 0) || !(max > 0) || !Number.isFinite(min) || !Number.isFinite(max)) return [0.1, 10];
  let lo = 10 ** Math.floor(Math.log10(min));
  let hi = 10 ** Math.ceil(Math.log10(max));
  if (hi <= lo) {
    lo /= 10;
    hi *= 10;
  }
  return [lo, hi];
}

/** Indices whose value is present: the steps a sparse series (eval loss, clipped steps) has. */
export function presentIndices(col: readonly (number | null)[]): number[] {
  const out: number[] = [];
  col.forEach((v, i) => {
    if (v !== null && Number.isFinite(v)) out.push(i);
  });
  return out;
}

/** Whether the run is on GPUs: some record reports per-GPU memory (a CPU run's hbm_peak_gib is []). */
export function onGpus(records: readonly MetricsRecord[]): boolean {
  return records.some((r) => Array.isArray(r.hbm_peak_gib) && r.hbm_peak_gib.length > 0);
}
