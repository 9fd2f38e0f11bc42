// The live uPlot chart of the job page: it redraws a ChartSpec from the whole stored run, downsampled to what its
// width can show (series.ts), and follows the layout the spec gives for the data (new phases, more GPUs, a
// prediction appearing). One axis per unit, so no line hides another; every name has hover text (glossary.ts).
import uPlot from "uplot";
import { h, replace } from "../dom";
import { axisNum, num, words } from "../fmt";
import { explain } from "../glossary";
import { autoExtent, column, isNonFinite, linearRange, logRange, MetricsStore, pickIndices, presentIndices, stack } from "../series";
import type { JobWarning, MetricsRecord } from "../types";
import { alpha, DEFAULT_VIEW, jobWarnings, MAX_SMOOTHING, maxGradNorm, WARN, type Axis, type ChartContext, type ChartSpec, type ChartView, type Layout, type Line } from "./spec";
import { logTickLabels } from "./ticks";

declare global {
  interface Window {
    __slidedpCharts?: Record<string, uPlot>;
  }
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

function legendValue(line: Line, v: number): string {
  return line.format ? line.format(v) : num(v, 4);
}
