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
export const PHASE_ORDER = ["data", "forward", "backward", "update_tail", "delivery_wait", "staging_wait"];

/** A "_busy" phase is work that overlaps the others (the CPU update running under backward): it is not a
 *  slice of the step's wall time, so it is drawn as a line, never stacked. */
export function isOverlapped(phase: string): boolean {
  return phase.endsWith("_busy");
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
