// What a chart of the job page is: its lines, axes and layout (ChartSpec), the colours the charts share, and what
// they read of the job besides its metrics. The charts themselves are one module per kind beside this one; the
// live plot that draws any of them is live.ts.
import type { Job, JobWarning, MetricsRecord } from "../types";

export const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
export const PHASE_COLOURS: Record<string, string> = {
  data: "#7f7f7f",
  forward: "#4e79a7",
  backward: "#f28e2b",
  update_tail: "#e15759",
  delivery_wait: "#76b7b2",
  staging_wait: "#b07aa1",
  update_busy: "#59a14f",
  update_cast_busy: "#9c755f",
  update_offcpu: "#edc948",
};
export const LOSS = "#d62728";
export const WARN = "#d97706";

export function alpha(hex: string, a: number): string {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

/** One y column of a chart: how to read it from a record and how to draw it. */
export interface Line {
  label: string;
  /** Hover text of its legend entry. */
  hint?: string;
  get: (r: MetricsRecord) => unknown;
  /** A column derived from the whole run (a moving average), instead of `get` per record. */
  column?: (records: readonly MetricsRecord[]) => (number | null)[];
  colour: string;
  scale?: string;
  dash?: number[];
  width?: number;
  /** Legend text of a value; by default four significant digits. */
  format?: (v: number) => string;
  /** Legend text from the record itself (a yes/no flag); wins over `format`. */
  describe?: (r: MetricsRecord) => string;
  /** What the legend says for a step that has the key with no finite value (a NaN loss arrives as null). */
  missingAs?: string;
  /** Points only, no line (clipped steps). */
  pointsOnly?: boolean;
  /** Present at a few steps only (eval loss): every such step is drawn, as a point joined to the next. */
  sparse?: boolean;
  /** Off until its legend entry is clicked. */
  hidden?: boolean;
}

export interface Axis {
  scale: string;
  label: string;
  side: 1 | 3;
  log?: boolean;
  /** How a value on this axis reads in notes. */
  format?: (v: number) => string;
  /** Tick labels, when the default short numbers ("12k", "0.5") are not the way to read this unit. */
  tick?: (v: number) => string;
}

export interface Layout {
  signature: string;
  lines: Line[];
  stacked?: number; // the first `stacked` lines are stacked areas
  axes: Axis[];
  /** Leave the first (warm-up) step out of the y range of the first axis; it is drawn cut off, with a note. */
  skipFirst?: boolean;
  /** Steps to mark with a red rule (non-finite loss). */
  marks?: (records: readonly MetricsRecord[]) => number[];
  /** A problem to say above the chart (red). */
  note?: (records: readonly MetricsRecord[]) => string | null;
  /** Facts to say under the title (muted): what is not drawn and why, figures that need no chart. */
  info?: string[];
}

/** What the reader chose for a chart: a log y axis, how much to smooth. */
export interface ChartView {
  log: boolean;
  smoothing: number;
}

/** What a chart reads from the job besides its metrics: its config (the clipping threshold) and its warnings. */
export interface ChartContext {
  job: Pick<Job, "config" | "warnings"> | null;
}

export interface ChartSpec {
  id: string;
  title: string;
  /** Hover text of the title: what the chart shows. */
  about?: string;
  controls?: { log?: boolean; smoothing?: boolean };
  layout(records: readonly MetricsRecord[], view: ChartView, ctx: ChartContext): Layout;
}

export const DEFAULT_VIEW: ChartView = { log: false, smoothing: 0 };
export const MAX_SMOOTHING = 0.99;

/** A job's warnings (docs/interfaces.md §6), the well-formed ones, in step order; none when the job has none. */
export function jobWarnings(job: { warnings?: unknown } | null | undefined): JobWarning[] {
  const list = job?.warnings;
  if (!Array.isArray(list)) return [];
  return list
    .filter((w): w is JobWarning => !!w && typeof w === "object" && typeof (w as JobWarning).step === "number" && Number.isFinite((w as JobWarning).step))
    .map((w) => ({ step: w.step, kind: typeof w.kind === "string" ? w.kind : "warning", message: typeof w.message === "string" ? w.message : "" }))
    .sort((a, b) => a.step - b.step);
}

/** The job's clipping threshold (optimizer.max_grad_norm) when clipping is on, else null. */
export function maxGradNorm(job: { config?: Record<string, unknown> } | null | undefined): number | null {
  const opt = job?.config?.optimizer;
  const v = opt && typeof opt === "object" ? (opt as Record<string, unknown>).max_grad_norm : undefined;
  return typeof v === "number" && Number.isFinite(v) && v > 0 ? v : null;
}
