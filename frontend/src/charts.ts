// Live uPlot charts of the job page. Every chart redraws from the whole stored run, downsampled to what its
// width can show (series.ts); the layout follows the data (new phases, more GPUs, a prediction appearing).
// One axis per unit, so no line hides another; every name has hover text (glossary.ts).
import uPlot from "uplot";
import { h, replace } from "./dom";
import { axisNum, gib, grouped, num, percent, sci, seconds, words } from "./fmt";
import { CHART_TERMS, explain, explainPhase } from "./glossary";
import {
  autoExtent,
  column,
  ema,
  gpuCount,
  isNonFinite,
  linearRange,
  logRange,
  MetricsStore,
  nonFiniteLossSteps,
  onGpus,
  phaseKind,
  phaseNames,
  pickIndices,
  presentIndices,
  stack,
} from "./series";
import type { Job, JobWarning, MetricsRecord } from "./types";

export const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const PHASE_COLOURS: Record<string, string> = {
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
const LOSS = "#d62728";
const WARN = "#d97706";

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

declare global {
  interface Window {
    __slidedpCharts?: Record<string, uPlot>;
  }
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

function loadView(id: string): ChartView {
  try {
    const saved = JSON.parse(localStorage.getItem(`slidedp.chart.${id}`) ?? "null") as Partial<ChartView> | null;
    return {
      log: saved?.log === true,
      smoothing: typeof saved?.smoothing === "number" && Number.isFinite(saved.smoothing) ? Math.min(MAX_SMOOTHING, Math.max(0, saved.smoothing)) : 0,
    };
  } catch {
    return { ...DEFAULT_VIEW };
  }
}

function saveView(id: string, view: ChartView): void {
  try {
    localStorage.setItem(`slidedp.chart.${id}`, JSON.stringify(view));
  } catch {
    // a browser without storage forgets the choice on reload; the chart still follows it now
  }
}

/** A chart bound to a MetricsStore; call update() after the store changes (redraws are coalesced). */
export class LiveChart {
  readonly el: HTMLElement;
  readonly view: ChartView;
  private readonly plotEl: HTMLElement;
  private readonly noteEl: HTMLElement;
  private readonly infoEl: HTMLElement;
  private readonly hoverEl: HTMLElement;
  private plot: uPlot | null = null;
  private layout: Layout | null = null;
  private signature = "";
  private raw: (number | null)[][] = [];
  private ys: (number | null)[][] = [];
  private markSteps: number[] = [];
  private warnings: JobWarning[] = [];
  private clipFirst: { step: number; above: boolean } | null = null;
  private ctx: ChartContext = { job: null };
  private ctxKey = "";
  private pending = false;
  private destroyed = false;
  private lastDraw = 0;
  private readonly resize: ResizeObserver;

  constructor(
    private readonly spec: ChartSpec,
    private readonly store: MetricsStore,
    private readonly maxPoints = 1500,
  ) {
    this.view = spec.controls ? loadView(spec.id) : { ...DEFAULT_VIEW };
    this.plotEl = h("div", { class: "chart-plot" }, h("p", { class: "muted chart-empty" }, "No step yet."));
    this.noteEl = h("p", { class: "chart-note", role: "status", hidden: true });
    this.infoEl = h("div", { class: "chart-info", hidden: true });
    this.hoverEl = h("p", { class: "chart-hover", hidden: true });
    this.el = h(
      "figure",
      { class: "chart", id: `chart-${spec.id}`, dataset: { points: "0", drawn: "0" } },
      h("figcaption", null, h("span", { class: "chart-title", title: spec.about }, spec.title), this.controls()),
      this.noteEl,
      this.infoEl,
      this.plotEl,
      this.hoverEl,
    );
    this.resize = new ResizeObserver(() => {
      if (this.plot) this.plot.setSize(this.size());
    });
    this.resize.observe(this.plotEl);
  }

  /** The job the chart belongs to (its config and warnings); redraws when what the chart reads of it changed. */
  setContext(ctx: ChartContext): void {
    const key = JSON.stringify([jobWarnings(ctx.job), maxGradNorm(ctx.job)]);
    this.ctx = ctx;
    if (key === this.ctxKey) return;
    this.ctxKey = key;
    this.update(true);
  }

  update(soon = false): void {
    if (this.pending || this.destroyed) return;
    this.pending = true;
    // At most a few redraws a second however fast steps arrive; the stored records are complete regardless.
    // A reader's own change (a toggle, the smoothing slider) is drawn at the next frame.
    const wait = soon ? 0 : Math.max(0, 250 - (performance.now() - this.lastDraw));
    setTimeout(() => requestAnimationFrame(() => this.draw()), wait);
  }

  destroy(): void {
    // a redraw still scheduled must not build a plot for a page that is gone
    this.destroyed = true;
    this.resize.disconnect();
    // the test hook names the chart on screen: only this chart's own entry goes
    if (window.__slidedpCharts && this.plot && window.__slidedpCharts[this.spec.id] === this.plot) delete window.__slidedpCharts[this.spec.id];
    this.plot?.destroy();
    this.plot = null;
  }

  private controls(): HTMLElement | null {
    const c = this.spec.controls;
    if (!c) return null;
    const box = h("span", { class: "chart-controls" });
    const id = `chart-${this.spec.id}`;
    if (c.log) {
      const log = h("input", { type: "checkbox", id: `${id}-log`, checked: this.view.log });
      log.addEventListener("change", () => {
        this.view.log = log.checked;
        saveView(this.spec.id, this.view);
        this.update(true);
      });
      box.append(h("label", { class: "check", for: `${id}-log`, title: "A logarithmic y axis: a loss that spans several orders of magnitude stays readable." }, log, "log scale"));
    }
    if (c.smoothing) {
      const out = h("output", { for: `${id}-smoothing`, class: "smoothing-value" }, this.view.smoothing.toFixed(2));
      const slider = h("input", { type: "range", id: `${id}-smoothing`, min: "0", max: String(MAX_SMOOTHING), step: "0.01", value: String(this.view.smoothing) });
      slider.addEventListener("input", () => {
        const w = Math.min(MAX_SMOOTHING, Math.max(0, Number(slider.value) || 0));
        this.view.smoothing = w;
        out.textContent = w.toFixed(2);
        saveView(this.spec.id, this.view);
        this.update(true);
      });
      box.append(h("label", { class: "smoothing", for: `${id}-smoothing`, title: explain("loss_smoothed") }, "smoothing ", slider, out));
    }
    return box;
  }

  private size(): { width: number; height: number } {
    return { width: Math.max(240, this.plotEl.clientWidth), height: 220 };
  }

  private draw(): void {
    this.pending = false;
    if (this.destroyed) return;
    this.lastDraw = performance.now();
    const records = this.store.records;
    this.el.dataset.points = String(records.length);
    if (records.length === 0) return;
    const layout = this.spec.layout(records, this.view, this.ctx);
    this.layout = layout;
    const full = layout.lines.map((l) => (l.column ? l.column(records) : column(records, l.get)));
    let idx = pickIndices(records.length, full, this.maxPoints);
    if (records.length > this.maxPoints) {
      // a sparse series (eval loss, clipped steps) keeps every step it has, while they are few
      const extra = layout.lines.flatMap((l, k) => (l.sparse || l.pointsOnly ? presentIndices(full[k]) : []));
      if (extra.length && extra.length <= this.maxPoints / 2) idx = Array.from(new Set([...idx, ...extra])).sort((a, b) => a - b);
    }
    const xs = idx.map((i) => records[i].step);
    this.raw = full.map((c) => idx.map((i) => c[i]));
    const nStacked = layout.stacked ?? 0;
    const drawnStacked = nStacked ? stack(this.raw.slice(0, nStacked)) : [];
    const logScales = new Set(layout.axes.filter((a) => a.log).map((a) => a.scale));
    this.ys = this.raw.map((c, k) => {
      if (k < nStacked) return drawnStacked[k];
      const log = logScales.has(layout.lines[k].scale ?? "y");
      return c.map((v) => (v !== null && Number.isFinite(v) && (!log || v > 0) ? v : null));
    });
    this.markSteps = layout.marks ? layout.marks(records) : [];
    this.warnings = jobWarnings(this.ctx.job);
    const data = [xs, ...this.ys] as uPlot.AlignedData;
    if (!this.plot || layout.signature !== this.signature) {
      this.plot?.destroy();
      replace(this.plotEl);
      this.signature = layout.signature;
      this.plot = new uPlot(this.options(layout), data, this.plotEl);
      this.legendHints(layout);
      (window.__slidedpCharts ??= {})[this.spec.id] = this.plot;
    } else {
      this.plot.setData(data);
    }
    // Without the cursor on it, the legend reads the newest step (uPlot would leave "--" until a first hover).
    if (this.plot.cursor.idx === null || this.plot.cursor.idx === undefined) this.plot.setLegend({ idx: null as unknown as number });
    this.el.dataset.drawn = String(xs.length);
    this.el.dataset.log = String(logScales.size > 0);

    const note = layout.note ? layout.note(records) : null;
    this.noteEl.hidden = !note;
    this.noteEl.textContent = note ?? "";
    const info = [...(layout.info ?? [])];
    const clipped = JSON.stringify(this.clipFirst);
    this.clipFirst = null;
    const warm = this.warmupNote(layout, records);
    if (warm) info.push(warm);
    // the ▲ of a cut-off first step is drawn by the draw hook, which ran before the scale was known
    if (JSON.stringify(this.clipFirst) !== clipped) this.plot.redraw(false, false);
    replace(this.infoEl, info.map((t) => h("p", t === warm ? { class: "warmup", title: explain("warmup") } : null, t)));
    this.infoEl.hidden = info.length === 0;

    // The canvas says nothing to a screen reader: the plot's label carries the newest values.
    const last = records[records.length - 1];
    const values = layout.lines
      .filter((l) => !l.column)
      .map((l) => {
        const v = l.get(last);
        return `${l.label} ${typeof v === "number" ? legendValue(l, v) : l.missingAs && isNonFinite(last, "loss") ? l.missingAs : "–"}`;
      });
    const warned = this.warnings.length ? `; ${this.warnings.length} warning${this.warnings.length > 1 ? "s" : ""} marked` : "";
    this.plotEl.setAttribute("role", "img");
    this.plotEl.setAttribute("aria-label", `${this.spec.title}, ${records.length} steps; step ${last.step}: ${values.join(", ")}${warned}`);
  }

  /** The note under a chart whose scale left the warm-up step out and so cut it off. */
  private warmupNote(layout: Layout, records: readonly MetricsRecord[]): string | null {
    if (!layout.skipFirst || !this.plot || records.length < 2) return null;
    const ax = layout.axes[0];
    const ext = this.extent(this.plot, ax);
    if (!ext || ext.first === null) return null;
    const [lo, hi] = this.range(this.plot, ax);
    if (ext.first <= hi && ext.first >= lo) return null;
    const above = ext.first > hi;
    const step = records[0].step;
    this.clipFirst = { step, above };
    const v = (ax.format ?? ((x: number) => num(x, 3)))(ext.first);
    return `Step ${step} (warm-up) reaches ${v}, ${above ? "above" : "below"} this scale: the scale follows the later steps, and the first point is drawn cut off (▲ at the edge).`;
  }

  private extent(u: uPlot, ax: Axis) {
    const layout = this.layout;
    if (!layout) return null;
    const cols = this.ys.filter((_, k) => (layout.lines[k].scale ?? "y") === ax.scale && u.series?.[k + 1]?.show !== false);
    return autoExtent(cols, !!layout.skipFirst && ax === layout.axes[0], !!ax.log);
  }

  private range(u: uPlot, ax: Axis): [number, number] {
    const ext = this.extent(u, ax);
    if (ax.log) return ext ? logRange(ext.min, ext.max) : [0.1, 10];
    const stackedHere = (this.layout?.stacked ?? 0) > 0 && ax.scale === "y";
    return ext ? linearRange(ext.min, ext.max, stackedHere) : [0, 1];
  }

  private options(layout: Layout): uPlot.Options {
    const nStacked = layout.stacked ?? 0;
    const series: uPlot.Series[] = [{ label: "step", value: (u, v) => String(v ?? u.data[0][u.data[0].length - 1] ?? "–") }];
    layout.lines.forEach((line, k) => {
      const si = k + 1;
      series.push({
        label: line.label,
        scale: line.scale ?? "y",
        stroke: line.colour,
        width: line.width ?? (k < nStacked ? 1 : 2),
        dash: line.dash,
        show: !line.hidden,
        fill: k < nStacked ? alpha(line.colour, 0.55) : undefined,
        paths: line.pointsOnly ? () => null : undefined,
        points: line.pointsOnly || line.sparse ? { show: true, size: line.pointsOnly ? 8 : 6, stroke: line.colour, fill: line.pointsOnly ? line.colour : "#ffffff", width: 1.5 } : { show: false },
        spanGaps: !!line.sparse,
        // The legend shows the recorded value, not the stacked sum, and says NaN when it was NaN.
        value: (_u, _v, _s, idx) => {
          // Off the chart the legend shows the newest step, so the numbers are readable at a glance.
          const col = this.raw[si - 1];
          const i = idx === null || idx === undefined ? (col ? col.length - 1 : -1) : idx;
          if (line.describe) {
            const rec = this.recordAt(i);
            return rec ? line.describe(rec) : "–";
          }
          const raw = col?.[i];
          if (raw === null || raw === undefined) {
            const rec = line.missingAs ? this.recordAt(i) : undefined;
            return rec && line.missingAs && isNonFinite(rec, "loss") ? line.missingAs : "–";
          }
          return legendValue(line, raw);
        },
      });
    });
    const bands: uPlot.Band[] = [];
    for (let k = 1; k < nStacked; k++) {
      bands.push({ series: [k + 1, k], fill: alpha(layout.lines[k].colour, 0.55) });
    }
    const scales: uPlot.Scales = { x: { time: false } };
    // Steps are whole numbers: never a tick at step 2.5.
    const stepIncrs = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000];
    const axes: uPlot.Axis[] = [{ label: "step", size: 36, labelSize: 16, incrs: stepIncrs }];
    for (const ax of layout.axes) {
      const labelledOnly = ax.log
        ? (u: uPlot, splits: number[]) => {
            const labels = logTickLabels(splits, u.bbox.height / devicePixelRatio);
            return splits.map((v, i) => (labels[i] ? v : null));
          }
        : undefined;
      scales[ax.scale] = ax.log
        ? { auto: true, distr: 3, log: 10, range: (u) => this.range(u, ax) }
        : { auto: true, range: (u) => this.range(u, ax) };
      axes.push({
        scale: ax.scale,
        side: ax.side,
        label: ax.label,
        labelSize: 16,
        // Wide enough for the longest tick label, so "1M" or "0.00012" is never clipped.
        size: (_u, values) => Math.max(40, 22 + 7 * Math.max(0, ...(values ?? []).map((v) => String(v).length))),
        // on a log axis only the labelled ticks get a grid line: nine lines a decade read as a grey band
        grid: labelledOnly ? { show: ax.side === 3, filter: labelledOnly } : { show: ax.side === 3 },
        ...(labelledOnly ? { ticks: { filter: labelledOnly } } : {}),
        values: ax.log ? (u, splits) => logTickLabels(splits, u.bbox.height / devicePixelRatio) : (_u, splits) => splits.map(ax.tick ?? axisNum),
      });
    }
    return {
      ...this.size(),
      scales,
      axes,
      series,
      bands,
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: false } },
      // a line switched off or on in the legend changes the scale, and so what the notes say
      hooks: { draw: [(u) => this.drawMarks(u)], setCursor: [(u) => this.hoverWarning(u)], setSeries: [() => this.update(true)] },
    };
  }

  /** Hover text on the legend entries: what each line is. */
  private legendHints(layout: Layout): void {
    const rows = this.plot?.root.querySelectorAll<HTMLElement>(".u-legend .u-series");
    if (!rows) return;
    layout.lines.forEach((line, k) => {
      const row = rows[k + 1];
      if (row && line.hint) {
        row.title = line.hint;
        row.classList.add("term");
      }
    });
  }

  /** The record drawn at index i of the current data. */
  private recordAt(i: number): MetricsRecord | undefined {
    const step = this.plot?.data[0][i];
    if (step === undefined || step === null) return undefined;
    const recs = this.store.records;
    let lo = 0;
    let hi = recs.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (recs[mid].step === step) return recs[mid];
      if (recs[mid].step < step) lo = mid + 1;
      else hi = mid - 1;
    }
    return undefined;
  }

  /** The warning at the step under the cursor, said under the chart. */
  private hoverWarning(u: uPlot): void {
    const left = u.cursor.left;
    let hit: JobWarning[] = [];
    if (this.warnings.length && left !== undefined && left >= 0) {
      hit = this.warnings.filter((w) => Math.abs(u.valToPos(w.step, "x") - left) <= 4);
    }
    this.hoverEl.hidden = hit.length === 0;
    this.hoverEl.textContent = hit.map((w) => `⚠ step ${w.step} · ${words(w.kind)}: ${w.message}`).join("\n");
  }

  /**
   * Rules drawn over the plot: red at steps whose loss is NaN/Inf (a diverged run must look different from a
   * stalled one), amber at the job's warnings, and a ▲ where the warm-up step is cut off by the scale.
   */
  private drawMarks(u: uPlot): void {
    const ctx = u.ctx;
    const { top, height } = u.bbox;
    const [x0, x1] = [u.scales.x.min ?? -Infinity, u.scales.x.max ?? Infinity];
    const dpr = devicePixelRatio;
    const rules = (steps: readonly number[], colour: string, label: string) => {
      if (steps.length === 0) return;
      ctx.save();
      ctx.strokeStyle = colour;
      ctx.fillStyle = colour;
      ctx.lineWidth = Math.max(1, dpr);
      ctx.setLineDash([4 * dpr, 3 * dpr]);
      ctx.font = `${11 * dpr}px system-ui, sans-serif`;
      let lastX = -Infinity;
      for (const step of steps) {
        if (step < x0 || step > x1) continue;
        const x = Math.round(u.valToPos(step, "x", true));
        if (x - lastX < 2) continue;
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
        if (x - lastX > 30 * dpr) ctx.fillText(label, x + 3, top + 12 * dpr);
        lastX = x;
      }
      ctx.restore();
    };
    rules(this.markSteps, "#d62728", "NaN");
    rules(this.warnings.map((w) => w.step), WARN, "!");
    if (this.clipFirst && this.clipFirst.step >= x0 && this.clipFirst.step <= x1) {
      const x = u.valToPos(this.clipFirst.step, "x", true);
      const y = this.clipFirst.above ? top + 1 : top + height - 1;
      const s = 5 * dpr;
      ctx.save();
      ctx.fillStyle = "#444444";
      ctx.beginPath();
      if (this.clipFirst.above) {
        ctx.moveTo(x, y);
        ctx.lineTo(x - s, y + 1.6 * s);
        ctx.lineTo(x + s, y + 1.6 * s);
      } else {
        ctx.moveTo(x, y);
        ctx.lineTo(x - s, y - 1.6 * s);
        ctx.lineTo(x + s, y - 1.6 * s);
      }
      ctx.closePath();
      ctx.fill();
      ctx.restore();
    }
  }
}

/**
 * Labels of a log axis: its ticks sit at 1..9 × 10^k, far too many to label. Label the mantissas that fit the
 * axis' height (1, 2, 5 with room; the powers of ten when it is tight; every other power of ten when tighter).
 */
export function logTickLabels(splits: readonly number[], heightPx: number): string[] {
  const pos = splits.filter((v) => v > 0);
  if (pos.length === 0) return splits.map(() => "");
  const decades = Math.max(1, Math.log10(Math.max(...pos) / Math.min(...pos)));
  const perDecade = heightPx / decades;
  const mantissas = perDecade >= 110 ? [1, 2, 5] : perDecade >= 60 ? [1, 3] : [1];
  const everyNth = perDecade >= 22 ? 1 : Math.ceil(22 / perDecade);
  return splits.map((v) => {
    if (!(v > 0)) return "";
    const k = Math.floor(Math.log10(v) + 1e-9);
    const m = Math.round(v / 10 ** k);
    if (!mantissas.includes(m) || Math.abs(v / 10 ** k - m) > 1e-6) return "";
    if (m === 1 && k % everyNth !== 0) return "";
    return axisNum(v);
  });
}

/** A time axis tick: "0", "250 ms", "1.5 s", never an exponent. */
export function secondsTick(v: number): string {
  if (v === 0) return "0";
  if (Math.abs(v) < 1) return `${Number((v * 1000).toPrecision(3))} ms`;
  return `${Number(v.toPrecision(3))} s`;
}

function legendValue(line: Line, v: number): string {
  return line.format ? line.format(v) : num(v, 4);
}

const gibText = (v: number) => gib(v);
const tokensText = (v: number) => `${grouped(v)} tokens/s`;

/** Median of the finite values of the last `n` records' key. */
function recentMedian(records: readonly MetricsRecord[], get: (r: MetricsRecord) => unknown, n: number): number | null {
  const vals = records
    .slice(-n)
    .map(get)
    .filter((v): v is number => typeof v === "number" && Number.isFinite(v))
    .sort((a, b) => a - b);
  if (!vals.length) return null;
  const m = vals.length >> 1;
  return vals.length % 2 ? vals[m] : (vals[m - 1] + vals[m]) / 2;
}

/**
 * Step time: the two spans that make up a step (forward, backward) stacked; the step time and the cost model's
 * prediction as lines; the host-side waits inside the spans and the updater's overlapped work as thin lines
 * (adding them to the stack would count their time twice). The warm-up step does not set the scale.
 */
export const stepTimeChart: ChartSpec = {
  id: "step-time",
  title: "Step time by phase",
  about: "The forward and backward spans make up the step and are stacked. Waits inside them (dashed) and the CPU updater's work beside them (dotted) are lines: they overlap the spans. Hover a legend entry for what it is.",
  layout(records) {
    const all = phaseNames(records);
    const spans = all.filter((p) => phaseKind(p) === "span");
    const waits = all.filter((p) => phaseKind(p) === "wait");
    const overlapped = all.filter((p) => phaseKind(p) === "overlapped");
    const hasPredicted = records.some((r) => typeof r.predicted?.step_time_s === "number");
    const hasSpans = spans.includes("forward") && records.some((r) => typeof r.predicted?.forward_span === "number");
    const colour = (p: string, i: number) => PHASE_COLOURS[p] ?? PALETTE[(i + 5) % PALETTE.length];
    const lines: Line[] = spans.map((p, i) => ({ label: words(p), hint: explainPhase(p), get: (r: MetricsRecord) => r.phases?.[p], colour: colour(p, i), format: seconds }));
    lines.push({ label: "step time", hint: CHART_TERMS.step_time.text, get: (r) => r.step_time_s, colour: "#222222", width: 1.5, format: seconds });
    waits.forEach((p, i) => {
      lines.push({ label: words(p), hint: explainPhase(p), get: (r) => r.phases?.[p], colour: colour(p, i + 2), dash: [5, 3], width: 1.5, format: seconds });
    });
    overlapped.forEach((p, i) => {
      lines.push({
        label: `${words(p)} (overlapped)`,
        hint: explainPhase(p),
        get: (r) => r.phases?.[p],
        colour: colour(p, i + 6),
        dash: [2, 3],
        width: 1.5,
        format: seconds,
        // the parts of update busy: one click away, so the default chart stays readable
        hidden: p !== "update_busy" && p.startsWith("update_"),
      });
    });
    if (hasPredicted) {
      lines.push({ label: "predicted", hint: CHART_TERMS.predicted.text, get: (r) => r.predicted?.step_time_s, colour: "#9467bd", dash: [6, 4], width: 2, format: seconds });
    }
    if (hasSpans) {
      lines.push({
        label: "predicted forward",
        hint: CHART_TERMS.predicted_forward.text,
        get: (r) => r.predicted?.forward_span,
        colour: PHASE_COLOURS.forward,
        dash: [6, 4],
        width: 1.5,
        format: seconds,
      });
    }
    return {
      signature: `${all.join(",")}|${hasPredicted}|${hasSpans}`,
      lines,
      stacked: spans.length,
      axes: [{ scale: "y", label: "time per step", side: 3, format: seconds, tick: secondsTick }],
      skipFirst: true,
      info: hasPredicted ? [] : ["No predicted step time for this job (its plan had no measured figures to time it with)."],
    };
  },
};

/**
 * Throughput in tokens/s, one axis. TFLOP/s is proportional to it (model FLOPs per token × tokens/s), so it is
 * said in figures on GPU runs instead of drawn as a second line that would lie on top of the first.
 */
export const throughputChart: ChartSpec = {
  id: "throughput",
  title: "Throughput (tokens/s)",
  about: CHART_TERMS.tokens_per_s.text,
  layout(records) {
    const info: string[] = [];
    const tf = recentMedian(records, (r) => r.tflops, 20);
    if (onGpus(records) && tf !== null && tf > 0) {
      const mfu = recentMedian(records, (r) => r.mfu, 20);
      const n = Math.min(20, records.length);
      info.push(`Model compute: ${num(tf, 4)} TFLOP/s${mfu !== null ? ` (MFU ${percent(mfu)})` : ""}, median of the last ${n} step${n > 1 ? "s" : ""}.`);
    }
    return {
      signature: "tokens",
      lines: [{ label: "tokens/s", hint: CHART_TERMS.tokens_per_s.text, get: (r) => r.tokens_per_s, colour: PALETTE[0], format: tokensText }],
      axes: [{ scale: "y", label: "tokens/s", side: 3, format: tokensText }],
      skipFirst: true,
      info,
    };
  },
};

export const memoryChart: ChartSpec = {
  id: "memory",
  title: "Memory (GiB)",
  layout(records) {
    const gpus = gpuCount(records);
    const lines: Line[] = [];
    for (let g = 0; g < gpus; g++) {
      lines.push({ label: `GPU ${g} HBM peak`, hint: CHART_TERMS.hbm_peak.text, get: (r) => r.hbm_peak_gib?.[g], colour: PALETTE[g % PALETTE.length], format: gibText });
    }
    lines.push({ label: "host RSS", hint: CHART_TERMS.host_rss.text, get: (r) => r.host_rss_gib, colour: "#555555", dash: [5, 3], format: gibText });
    return { signature: String(gpus), lines, axes: [{ scale: "y", label: "GiB", side: 3, format: gibText }] };
  },
};

/** Steps whose loss is not finite, said in words. */
function nonFiniteNote(recs: readonly MetricsRecord[]): string | null {
  const bad = nonFiniteLossSteps(recs);
  if (bad.length === 0) return null;
  return `Loss is not a finite number at ${bad.length} step${bad.length > 1 ? "s" : ""} (first: step ${bad[0]}, last: step ${bad[bad.length - 1]}).`;
}

/**
 * Training loss (raw, and its moving average when smoothing is on), eval loss where evaluation ran, and the
 * learning rate on its own axis. The loss axis can be logarithmic: a run that blows up to 1e7 and settles at 6
 * is unreadable on a linear one.
 */
export const lossChart: ChartSpec = {
  id: "loss",
  title: "Loss and learning rate",
  about: "Training loss per step; with smoothing, its moving average over the faint raw curve. Eval loss is drawn where evaluation ran. The learning rate has its own axis on the right.",
  controls: { log: true, smoothing: true },
  layout(records, view) {
    const smooth = view.smoothing > 0;
    const hasEval = records.some((r) => "eval_loss" in r && r.eval_loss !== undefined);
    const lines: Line[] = [
      // the raw loss stays the first series, faint beneath the average when smoothing is on
      { label: "loss", hint: CHART_TERMS.loss.text, get: (r) => r.loss, colour: smooth ? alpha(LOSS, 0.3) : LOSS, width: smooth ? 1 : 2, missingAs: "NaN" },
    ];
    if (smooth) {
      lines.push({
        label: "loss (smoothed)",
        hint: CHART_TERMS.loss_smoothed.text,
        get: () => undefined,
        column: (recs) => ema(column(recs, (r) => r.loss), view.smoothing),
        colour: LOSS,
        width: 2,
      });
    }
    if (hasEval) lines.push({ label: "eval loss", hint: CHART_TERMS.eval_loss.text, get: (r) => r.eval_loss, colour: "#2ca02c", width: 2, sparse: true });
    lines.push({ label: "lr", hint: CHART_TERMS.lr.text, get: (r) => r.lr, colour: PALETTE[0], scale: "lr", width: 1.5, format: sci });
    return {
      signature: `loss|${view.log}|${smooth}|${hasEval}`,
      lines,
      axes: [
        { scale: "y", label: view.log ? "loss (log)" : "loss", side: 3, log: view.log },
        { scale: "lr", label: "lr", side: 1 },
      ],
      marks: nonFiniteLossSteps,
      note: nonFiniteNote,
    };
  },
};

/** The global gradient norm, the steps where clipping fired, and the clipping threshold. */
export const gradNormChart: ChartSpec = {
  id: "grad-norm",
  title: "Gradient norm",
  about: CHART_TERMS.grad_norm.text,
  controls: { log: true },
  layout(records, view, ctx) {
    const max = maxGradNorm(ctx.job);
    const has = records.some((r) => typeof r.grad_norm === "number");
    const clipped = records.filter((r) => r.clipped === true).length;
    const lines: Line[] = [
      { label: "grad norm", hint: CHART_TERMS.grad_norm.text, get: (r) => r.grad_norm, colour: PALETTE[6], width: 1.5 },
      {
        label: "clipped",
        hint: CHART_TERMS.clipped.text,
        get: (r) => (r.clipped === true ? r.grad_norm : null),
        describe: (r) => (r.clipped === true ? "yes" : r.clipped === false ? "no" : "–"),
        colour: WARN,
        pointsOnly: true,
      },
    ];
    if (max !== null) lines.push({ label: "max grad norm", hint: CHART_TERMS.clip_threshold.text, get: () => max, colour: "#7f7f7f", dash: [6, 4], width: 1 });
    const info: string[] = [];
    if (!has) info.push("These records carry no gradient norm.");
    else if (max === null) info.push(`No clipping (max grad norm 0): the norm is reported only.${clipped ? ` ${clipped} step${clipped > 1 ? "s" : ""} reported clipped.` : ""}`);
    else info.push(`Clipped at ${clipped} of ${records.length} step${records.length > 1 ? "s" : ""} (max grad norm ${num(max, 4)}).`);
    return {
      signature: `grad|${view.log}|${max}`,
      lines,
      axes: [{ scale: "y", label: view.log ? "L2 norm (log)" : "L2 norm", side: 3, log: view.log }],
      info,
    };
  },
};

export const JOB_CHARTS: ChartSpec[] = [lossChart, gradNormChart, stepTimeChart, throughputChart, memoryChart];
