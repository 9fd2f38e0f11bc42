// What the compare page (pages/compare.ts) shows besides the curves' columns (overlay.ts): which config keys tell
// the compared jobs apart, which metrics are charted, and each chart's view: its axis (log when the values span
// decades, unless the person chose) and the points of a diverged run it leaves out of the scale. No DOM here.
import { fieldLabel } from "./jobform";
import { leafPaths, getPath } from "./schema";

/** A metric the compare page charts (docs/interfaces.md §3 keys). */
export interface ComparedMetric {
  key: string;
  /** Its eval counterpart drawn dashed in the run's colour (eval loss). */
  evalKey: string | null;
  title: string;
  /** The y axis's name. */
  axis: string;
  /** The figure's id is `chart-${chartId}`; the loss chart keeps the page's first id, "compare". */
  chartId: string;
  /** The URL parameter keeping an explicit axis choice (overlay.ts SCALE_PARAMS). */
  scaleParam: string;
  /** Hover text of the title. */
  hint: string;
  /** A non-finite value is a divergence (a marker), not merely a missing measurement. */
  nonFiniteDiverges: boolean;
  digits: number;
}

export const COMPARED_METRICS: readonly ComparedMetric[] = [
  { key: "loss", evalKey: "eval_loss", title: "Loss by step", axis: "loss", chartId: "compare", scaleParam: "log", nonFiniteDiverges: true, digits: 4, hint: "Training loss per step of each job (solid), its eval loss where it evaluated (dashed, same colour). A dotted rule in a job's colour marks the step where a later attempt of it resumed from a checkpoint; its curve is one line, each step from its newest attempt." },
  { key: "grad_norm", evalKey: null, title: "Gradient norm", axis: "grad norm", chartId: "compare-grad-norm", scaleParam: "log_grad_norm", nonFiniteDiverges: true, digits: 3, hint: "The gradients' global L2 norm per step, before clipping." },
  { key: "step_time_s", evalKey: null, title: "Step time", axis: "seconds", chartId: "compare-step-time", scaleParam: "log_step_time", nonFiniteDiverges: false, digits: 3, hint: "Wall time of each optimizer step; the first pays for warm-up." },
  { key: "tokens_per_s", evalKey: null, title: "Tokens per second", axis: "tokens/s", chartId: "compare-tokens", scaleParam: "log_tokens", nonFiniteDiverges: false, digits: 4, hint: "Training tokens per second of wall time, per step." },
];

// ------------------------------------------------------------------------------------------ config differences
export interface ConfigDiffRow {
  /** The dotted config key ("optimizer.lr"). */
  key: string;
  /** The job form's label for it, else the key in words. */
  label: string;
  /** Each job's value as text, in the jobs' order; "–" where a job's config has no such key. */
  values: string[];
}

/** A config value as the table shows it: text as it is, null as "none", the rest as JSON. */
export function configText(v: unknown): string {
  if (v === undefined) return "–";
  if (v === null) return "none";
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

/**
 * The config keys whose values differ between the jobs, flattened to dotted keys (arrays are values), in the order
 * the first job that has each key lists it. Keys every job holds with one value are left out: the table says what
 * tells the runs apart. `output_dir` differs between any two jobs by design and is left out too.
 */
export function configDiff(configs: readonly unknown[], label: (key: string) => string = fieldLabel): ConfigDiffRow[] {
  if (configs.length < 2) return [];
  const keys: string[] = [];
  const seen = new Set<string>();
  for (const c of configs) for (const k of leafPaths(c)) if (!seen.has(k)) (seen.add(k), keys.push(k));
  const rows: ConfigDiffRow[] = [];
  for (const key of keys) {
    if (key === "output_dir") continue;
    const values = configs.map((c) => configText(getPath(c, key)));
    if (values.every((v) => v === values[0])) continue;
    rows.push({ key, label: label(key), values });
  }
  return rows;
}

// ----------------------------------------------------------------------------------------------- a chart's view
/** A value this many times above the others' usual top is a divergence: left out of the scale, marked instead. */
export const FAR = 10;
/** The shown values span at least this ratio (two decades): the axis turns logarithmic by itself. */
export const LOG_SPAN = 100;

/** One drawn line: which compared job it belongs to and its values on the shared step axis. */
export interface ViewSeries {
  run: number;
  values: readonly (number | null)[];
}

/** A diverged run's mark at the chart's top edge. */
export interface ClipMark {
  run: number;
  step: number;
  /** The highest value left out of the scale; null when the run went non-finite (NaN, ±inf). */
  value: number | null;
  /** How many of its points lie above the view. */
  points: number;
}

export interface View {
  /** The shown values' extremes (null when nothing is shown). */
  min: number | null;
  max: number | null;
  /** The axis drawn: the explicit choice, else `autoLog`. */
  log: boolean;
  /** What the values alone would pick: log when every shown value is > 0 and they span LOG_SPAN or more. */
  autoLog: boolean;
  clips: ClipMark[];
}

function quantile(sorted: readonly number[], q: number): number {
  const i = (sorted.length - 1) * q;
  const lo = Math.floor(i);
  return sorted[lo] + (sorted[Math.min(lo + 1, sorted.length - 1)] - sorted[lo]) * (i - lo);
}

/**
 * A chart's scale and its diverged points. Each job's usual top is the 90th percentile of its finite values (a few
 * spikes do not move it); a job's point above FAR times the others' usual top (the lower median of the other jobs'
 * tops; its own when it is the only job) is left out of the scale and marked at the top edge, one mark per job at
 * its highest such point, as is a job's first non-finite step (`nonFinite`, per job). The axis is `explicit` when
 * the person chose, else log when the shown values are all positive and span LOG_SPAN or more.
 */
export function viewOf(steps: readonly number[], series: readonly ViewSeries[], nonFinite: readonly (number | null)[] = [], explicit: boolean | null = null): View {
  const finiteOf = (vs: readonly (number | null)[]) => vs.filter((v): v is number => typeof v === "number" && Number.isFinite(v));
  const runs = Array.from(new Set(series.map((s) => s.run)));
  const top = new Map<number, number>();
  for (const r of runs) {
    const vals = series.filter((s) => s.run === r).flatMap((s) => finiteOf(s.values)).sort((a, b) => a - b);
    if (vals.length) top.set(r, quantile(vals, 0.9));
  }
  const capOf = (r: number): number => {
    const others = runs.filter((o) => o !== r && top.has(o)).map((o) => top.get(o) as number).sort((a, b) => a - b);
    const ref = others.length ? others[(others.length - 1) >> 1] : top.get(r);
    return ref !== undefined && ref > 0 ? FAR * ref : Infinity;
  };
  let min = Infinity;
  let max = -Infinity;
  const clipped = new Map<number, ClipMark>();
  for (const s of series) {
    const cap = capOf(s.run);
    s.values.forEach((v, i) => {
      if (typeof v !== "number" || !Number.isFinite(v)) return;
      if (v > cap) {
        const m = clipped.get(s.run);
        if (!m) clipped.set(s.run, { run: s.run, step: steps[i], value: v, points: 1 });
        else {
          m.points++;
          if (v > (m.value as number)) (m.value = v), (m.step = steps[i]);
        }
        return;
      }
      if (v < min) min = v;
      if (v > max) max = v;
    });
  }
  const clips = runs.flatMap((r) => {
    const out: ClipMark[] = [];
    const m = clipped.get(r);
    if (m) out.push(m);
    const nf = nonFinite[r];
    if (nf !== null && nf !== undefined) out.push({ run: r, step: nf, value: null, points: 1 });
    return out;
  });
  const any = min <= max;
  const autoLog = any && min > 0 && max / min >= LOG_SPAN;
  return { min: any ? min : null, max: any ? max : null, log: explicit ?? autoLog, autoLog, clips };
}

/** A mark's hover text: "run #7 reached 1.2e+05 at step 40" (and how many more points lie above the view). */
export function clipText(jobId: number, mark: ClipMark, fmt: (v: number) => string, what = "a value"): string {
  if (mark.value === null) return `run #${jobId} reached a non-finite ${what} (NaN or infinity) at step ${mark.step}`;
  const more = mark.points > 1 ? `; ${mark.points - 1} more of its points lie above the view` : "";
  return `run #${jobId} reached ${fmt(mark.value)} at step ${mark.step}${more}`;
}
