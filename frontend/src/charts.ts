// Live uPlot charts of the job page. Every chart redraws from the whole stored run, downsampled to what its
// width can show (series.ts); the layout follows the data (new phases, more GPUs, a prediction appearing).
import uPlot from "uplot";
import { h, replace } from "./dom";
import { axisNum, num, words } from "./fmt";
import { column, gpuCount, isNonFinite, isOverlapped, MetricsStore, nonFiniteLossSteps, phaseNames, pickIndices, stack } from "./series";
import type { MetricsRecord } from "./types";

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const PHASE_COLOURS: Record<string, string> = {
  data: "#9c9c9c",
  forward: "#4e79a7",
  backward: "#f28e2b",
  update_tail: "#e15759",
  delivery_wait: "#76b7b2",
  staging_wait: "#b07aa1",
};

function alpha(hex: string, a: number): string {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

/** One y column of a chart: how to read it from a record and how to draw it. */
interface Line {
  label: string;
  get: (r: MetricsRecord) => unknown;
  colour: string;
  scale?: string;
  dash?: number[];
  width?: number;
  unit?: string;
  /** What the legend says for a step that has the key with no finite value (a NaN loss arrives as null). */
  missingAs?: string;
}

interface Layout {
  signature: string;
  lines: Line[];
  stacked?: number; // the first `stacked` lines are stacked areas
  axes: { scale: string; label: string; side: 1 | 3 }[];
  /** Steps to mark with a red rule (non-finite loss). */
  marks?: (records: readonly MetricsRecord[]) => number[];
  note?: (records: readonly MetricsRecord[]) => string | null;
}

export interface ChartSpec {
  id: string;
  title: string;
  layout(records: readonly MetricsRecord[]): Layout;
}

declare global {
  interface Window {
    __slidedpCharts?: Record<string, uPlot>;
  }
}

/** A chart bound to a MetricsStore; call update() after the store changes (redraws are coalesced). */
export class LiveChart {
  readonly el: HTMLElement;
  private readonly plotEl: HTMLElement;
  private readonly noteEl: HTMLElement;
  private plot: uPlot | null = null;
  private signature = "";
  private raw: (number | null)[][] = [];
  private markSteps: number[] = [];
  private pending = false;
  private lastDraw = 0;
  private readonly resize: ResizeObserver;

  constructor(
    private readonly spec: ChartSpec,
    private readonly store: MetricsStore,
    private readonly maxPoints = 1500,
  ) {
    this.plotEl = h("div", { class: "chart-plot" }, h("p", { class: "muted chart-empty" }, "Waiting for the first step…"));
    this.noteEl = h("p", { class: "chart-note", role: "status", hidden: true });
    this.el = h(
      "figure",
      { class: "chart", id: `chart-${spec.id}`, dataset: { points: "0", drawn: "0" } },
      h("figcaption", null, spec.title),
      this.noteEl,
      this.plotEl,
    );
    this.resize = new ResizeObserver(() => {
      if (this.plot) this.plot.setSize(this.size());
    });
    this.resize.observe(this.plotEl);
  }

  update(): void {
    if (this.pending) return;
    this.pending = true;
    // At most a few redraws a second however fast steps arrive; the stored records are complete regardless.
    const wait = Math.max(0, 250 - (performance.now() - this.lastDraw));
    setTimeout(() => requestAnimationFrame(() => this.draw()), wait);
  }

  destroy(): void {
    this.resize.disconnect();
    this.plot?.destroy();
    this.plot = null;
    if (window.__slidedpCharts) delete window.__slidedpCharts[this.spec.id];
  }

  private size(): { width: number; height: number } {
    return { width: Math.max(240, this.plotEl.clientWidth), height: 220 };
  }

  private draw(): void {
    this.pending = false;
    this.lastDraw = performance.now();
    const records = this.store.records;
    this.el.dataset.points = String(records.length);
    if (records.length === 0) return;
    const layout = this.spec.layout(records);
    const cols = layout.lines.map((l) => column(records, l.get));
    const idx = pickIndices(records.length, cols, this.maxPoints);
    const xs = idx.map((i) => records[i].step);
    this.raw = cols.map((c) => idx.map((i) => c[i]));
    const drawnStacked = layout.stacked ? stack(this.raw.slice(0, layout.stacked)) : [];
    const ys = this.raw.map((c, k) =>
      k < (layout.stacked ?? 0) ? drawnStacked[k] : c.map((v) => (v !== null && Number.isFinite(v) ? v : null)),
    );
    this.markSteps = layout.marks ? layout.marks(records) : [];
    const note = layout.note ? layout.note(records) : null;
    this.noteEl.hidden = !note;
    this.noteEl.textContent = note ?? "";
    const data = [xs, ...ys] as uPlot.AlignedData;
    if (!this.plot || layout.signature !== this.signature) {
      this.plot?.destroy();
      replace(this.plotEl);
      this.signature = layout.signature;
      this.plot = new uPlot(this.options(layout), data, this.plotEl);
      (window.__slidedpCharts ??= {})[this.spec.id] = this.plot;
    } else {
      this.plot.setData(data);
    }
    this.el.dataset.drawn = String(xs.length);
    // The canvas says nothing to a screen reader: the plot's label carries the newest values.
    const last = records[records.length - 1];
    const values = layout.lines.map((l) => {
      const v = l.get(last);
      return `${l.label} ${typeof v === "number" ? num(v, 4) : l.missingAs && isNonFinite(last, "loss") ? l.missingAs : "–"}`;
    });
    this.plotEl.setAttribute("role", "img");
    this.plotEl.setAttribute("aria-label", `${this.spec.title}, ${records.length} steps; step ${last.step}: ${values.join(", ")}`);
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
        fill: k < nStacked ? alpha(line.colour, 0.55) : undefined,
        points: { show: false },
        spanGaps: false,
        // The legend shows the recorded value, not the stacked sum, and says NaN when it was NaN.
        value: (_u, _v, _s, idx) => {
          // Off the chart the legend shows the newest step, so the numbers are readable at a glance.
          const col = this.raw[si - 1];
          const i = idx === null || idx === undefined ? (col ? col.length - 1 : -1) : idx;
          const raw = col?.[i];
          if (raw === null || raw === undefined) {
            const rec = line.missingAs ? this.recordAt(i) : undefined;
            return rec && line.missingAs && isNonFinite(rec, "loss") ? line.missingAs : "–";
          }
          return num(raw, 4) + (line.unit ? ` ${line.unit}` : "");
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
      scales[ax.scale] = { auto: true, range: (_u, min, max) => rangeFrom(min, max, ax.scale === "y" && nStacked > 0) };
      axes.push({
        scale: ax.scale,
        side: ax.side,
        label: ax.label,
        labelSize: 16,
        // Wide enough for the longest tick label, so "1M" or "0.00012" is never clipped.
        size: (_u, values) => Math.max(40, 22 + 7 * Math.max(0, ...(values ?? []).map((v) => String(v).length))),
        grid: { show: ax.side === 3 },
        values: (_u, splits) => splits.map(axisNum),
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
      hooks: { draw: [(u) => this.drawMarks(u)] },
    };
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

  /** Red rules at steps whose loss is NaN/Inf: a diverged run must look different from a stalled one. */
  private drawMarks(u: uPlot): void {
    if (this.markSteps.length === 0) return;
    const ctx = u.ctx;
    const { top, height } = u.bbox;
    ctx.save();
    ctx.strokeStyle = "#d62728";
    ctx.fillStyle = "#d62728";
    ctx.lineWidth = Math.max(1, devicePixelRatio);
    ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
    let lastX = -Infinity;
    for (const step of this.markSteps) {
      const x = Math.round(u.valToPos(step, "x", true));
      if (x - lastX < 2) continue;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      if (x - lastX > 30 * devicePixelRatio) ctx.fillText("NaN", x + 3, top + 12 * devicePixelRatio);
      lastX = x;
    }
    ctx.restore();
  }
}

function rangeFrom(min: number | null, max: number | null, fromZero: boolean): uPlot.Range.MinMax {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  const lo = fromZero || min >= 0 ? Math.min(0, min) : min;
  let hi = max;
  if (hi <= lo) hi = lo === 0 ? 1 : lo + Math.abs(lo) * 0.1;
  return [lo, hi + (hi - lo) * 0.05];
}

const num0 = (r: MetricsRecord, k: string) => r[k];

/** Step time stacked by measured phase, the measured step time and the cost model's prediction as lines. */
export const stepTimeChart: ChartSpec = {
  id: "step-time",
  title: "Step time by phase (s)",
  layout(records) {
    const all = phaseNames(records);
    const phases = all.filter((p) => !isOverlapped(p));
    const overlapped = all.filter(isOverlapped);
    const hasPredicted = records.some((r) => typeof r.predicted?.step_time_s === "number");
    // the model's forward cut where the engine cuts it: comparable with the top of the measured band below it
    const below = phases.slice(0, Math.max(0, phases.indexOf("forward")));
    const hasSpans = phases.includes("forward") && records.some((r) => typeof r.predicted?.forward_span === "number");
    const lines: Line[] = phases.map((p, i) => ({
      label: words(p),
      get: (r: MetricsRecord) => r.phases?.[p],
      colour: PHASE_COLOURS[p] ?? PALETTE[(i + 5) % PALETTE.length],
      unit: "s",
    }));
    lines.push({ label: "step time", get: (r) => num0(r, "step_time_s"), colour: "#222222", width: 1.5, unit: "s" });
    overlapped.forEach((p, i) => {
      lines.push({ label: `${words(p)} (overlapped)`, get: (r) => r.phases?.[p], colour: PALETTE[(i + 6) % PALETTE.length], dash: [2, 3], width: 1.5, unit: "s" });
    });
    if (hasPredicted) {
      lines.push({ label: "predicted", get: (r) => r.predicted?.step_time_s, colour: "#9467bd", dash: [6, 4], width: 2, unit: "s" });
    }
    if (hasSpans) {
      const top = (r: MetricsRecord) => {
        const f = r.predicted?.forward_span;
        return typeof f === "number" ? below.reduce((sum, p) => sum + (r.phases?.[p] ?? 0), f) : undefined;
      };
      lines.push({ label: "predicted forward", get: top, colour: PHASE_COLOURS.forward ?? "#4e79a7", dash: [6, 4], width: 1.5, unit: "s" });
    }
    return {
      signature: `${all.join(",")}|${hasPredicted}|${hasSpans}`,
      lines,
      stacked: phases.length,
      axes: [{ scale: "y", label: "seconds", side: 3 }],
      note: () => (hasPredicted ? null : "No predicted step time for this job (its plan had no measured figures to time it with)."),
    };
  },
};

export const throughputChart: ChartSpec = {
  id: "throughput",
  title: "Throughput",
  layout(records) {
    const hasTflops = records.some((r) => typeof r.tflops === "number");
    const lines: Line[] = [{ label: "tokens/s", get: (r) => r.tokens_per_s, colour: PALETTE[0], scale: "y" }];
    const axes: Layout["axes"] = [{ scale: "y", label: "tokens/s", side: 3 }];
    if (hasTflops) {
      lines.push({ label: "TFLOP/s", get: (r) => r.tflops, colour: PALETTE[1], scale: "tf" });
      axes.push({ scale: "tf", label: "TFLOP/s", side: 1 });
    }
    return { signature: String(hasTflops), lines, axes };
  },
};

export const memoryChart: ChartSpec = {
  id: "memory",
  title: "Memory (GiB)",
  layout(records) {
    const gpus = gpuCount(records);
    const lines: Line[] = [];
    for (let g = 0; g < gpus; g++) {
      lines.push({ label: `GPU ${g} HBM peak`, get: (r) => r.hbm_peak_gib?.[g], colour: PALETTE[g % PALETTE.length], unit: "GiB" });
    }
    lines.push({ label: "host RSS", get: (r) => r.host_rss_gib, colour: "#555555", dash: [5, 3], unit: "GiB" });
    return { signature: String(gpus), lines, axes: [{ scale: "y", label: "GiB", side: 3 }] };
  },
};

export const lossChart: ChartSpec = {
  id: "loss",
  title: "Loss and learning rate",
  layout() {
    return {
      signature: "loss",
      lines: [
        { label: "loss", get: (r) => r.loss, colour: PALETTE[3], scale: "y", missingAs: "NaN" },
        { label: "lr", get: (r) => r.lr, colour: PALETTE[0], scale: "lr", width: 1.5 },
      ],
      axes: [
        { scale: "y", label: "loss", side: 3 },
        { scale: "lr", label: "lr", side: 1 },
      ],
      marks: nonFiniteLossSteps,
      note: (recs) => {
        const bad = nonFiniteLossSteps(recs);
        if (bad.length === 0) return null;
        return `Loss is not a finite number at ${bad.length} step${bad.length > 1 ? "s" : ""} (first: step ${bad[0]}, last: step ${bad[bad.length - 1]}).`;
      },
    };
  },
};

export const JOB_CHARTS: ChartSpec[] = [stepTimeChart, throughputChart, memoryChart, lossChart];
