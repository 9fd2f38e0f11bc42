// Compare page: the loss curves of several jobs on one step axis, each job in its own colour with its eval loss
// dashed in the same colour, a resumed job's attempts joined into one line with a rule where it resumed. The
// selection is the URL (`/jobs/compare?ids=3,5&log=1`, overlay.ts), so a reload or a shared link shows the same.
// The curves are read once when the page opens (and on Refresh): the job page is the live view of one run.
import uPlot from "uplot";
import { allMetrics, api, ApiError } from "../api";
import { logTickLabels, PALETTE } from "../charts";
import { h, replace } from "../dom";
import { axisNum, num } from "../fmt";
import { apiAbsent } from "../health";
import { compareHref, overlay, parseSelection, resumeSteps, type Overlay } from "../overlay";
import type { Cleanup } from "../router";
import { autoExtent, linearRange, logRange, MetricsStore } from "../series";
import { TERMINAL_STATUSES, type Job, type MetricsRecord } from "../types";
import { errorBox, jobStatusBadge } from "../ui";

const CHART_ID = "compare";
const HEIGHT = 360;

/** One compared job: what the API said of it, its records, or why it is not drawn. */
interface Run {
  id: number;
  colour: string;
  job: Job | null;
  records: readonly MetricsRecord[];
  missing: boolean;
  error: unknown;
}

const jobLabel = (run: Run) => `#${run.id}${run.job?.name ? ` ${run.job.name}` : ""}`;

export function comparePage(root: HTMLElement): Cleanup {
  const sel = parseSelection(location.search);
  let log = sel.log;
  let stopped = false;
  let plot: uPlot | null = null;
  let runs: Run[] = [];
  let drawn: Run[] = [];
  let data: Overlay | null = null;
  // the uPlot series index of each drawn job's loss line (its eval line, when it has one, follows it)
  let lossSeries: number[] = [];

  const logBox = h("input", { type: "checkbox", id: "compare-log", checked: log });
  const refresh = h("button", { type: "button", class: "secondary" }, "Refresh");
  const problemsEl = h("div", { id: "compare-problems" });
  const messageEl = h("div", { class: "page-message" });
  const plotEl = h("div", { class: "chart-plot" }, h("p", { class: "muted chart-empty" }, "Loading the curves…"));
  const infoEl = h("div", { class: "chart-info" });
  const figure = h(
    "figure",
    { class: "chart", id: `chart-${CHART_ID}`, dataset: { jobs: "0", drawn: "0", log: String(log), resumes: "{}" } },
    h(
      "figcaption",
      null,
      h("span", { class: "chart-title", title: "Training loss per step of each job (solid), its eval loss where it evaluated (dashed, same colour). A dotted rule in a job's colour marks the step where a later attempt of it resumed from a checkpoint; its curve is one line, each step from its newest attempt." }, "Loss by step"),
      h("span", { class: "chart-controls" }, h("label", { class: "check", for: "compare-log", title: "A logarithmic loss axis: runs that differ by orders of magnitude stay readable." }, logBox, "log scale")),
    ),
    infoEl,
    plotEl,
  );
  const tbody = h("tbody");
  const table = h(
    "table",
    { class: "compare-table", id: "compare-runs" },
    h("caption", null, "Compared jobs"),
    h("thead", null, h("tr", null, ["", "Job", "Status", "Steps", "Final loss", "Final eval loss", "Resumed at step"].map((c) => h("th", { scope: "col" }, c)))),
    tbody,
  );
  const back = h("a", { class: "button", href: sel.ids.length ? `/jobs?select=${sel.ids.join(",")}` : "/jobs" }, "Change selection");

  replace(
    root,
    h("div", { class: "page-head" }, h("h1", null, "Compare jobs"), h("div", { class: "toolbar" }, back, refresh)),
    problemsEl,
    messageEl,
    figure,
    h("div", { class: "table-wrap" }, table),
  );

  const resize = new ResizeObserver(() => plot?.setSize(size()));
  resize.observe(plotEl);

  logBox.addEventListener("change", () => {
    log = logBox.checked;
    // the choice is part of the comparison a link shares
    history.replaceState(history.state, "", compareHref(sel.ids, log));
    draw();
  });
  refresh.addEventListener("click", () => void load());

  function size(): { width: number; height: number } {
    return { width: Math.max(280, plotEl.clientWidth), height: HEIGHT };
  }

  async function load(): Promise<void> {
    if (sel.ids.length === 0) {
      showProblems(sel.problems);
      figure.hidden = true;
      table.hidden = true;
      replace(
        messageEl,
        h("p", { class: "error-box", role: "alert" }, "No jobs to compare: this address names none. Tick the jobs to compare in the ", h("a", { href: "/jobs" }, "jobs list"), ", then press Compare."),
      );
      return;
    }
    if (await apiAbsent()) {
      replace(messageEl, h("p", { class: "muted" }, "The comparison appears here once the API answers."));
      return;
    }
    refresh.disabled = true;
    const loaded = await Promise.all(
      sel.ids.map(async (id, k): Promise<Run> => {
        const run: Run = { id, colour: PALETTE[k % PALETTE.length], job: null, records: [], missing: false, error: null };
        try {
          // the job first: a job that is not there is one failed request, not two
          const job = await api.job(id);
          const recs = await allMetrics(id);
          const store = new MetricsStore();
          store.addMany(recs);
          return { ...run, job, records: store.records };
        } catch (err) {
          if (err instanceof ApiError && err.status === 404) return { ...run, missing: true };
          return { ...run, error: err };
        }
      }),
    );
    refresh.disabled = false;
    if (stopped) return;
    runs = loaded;
    drawn = runs.filter((r) => r.job !== null);
    const problems = [...sel.problems, ...runs.filter((r) => r.missing).map((r) => `Job #${r.id} does not exist (it was deleted, or never created).`)];
    showProblems(problems);
    replace(messageEl, ...runs.filter((r) => r.error !== null).map((r) => errorBox(r.error, `job #${r.id}`)));
    if (drawn.length === 0) {
      figure.hidden = true;
      table.hidden = true;
      if (!runs.some((r) => r.error !== null)) messageEl.append(h("p", { class: "error-box", role: "alert" }, "None of the jobs this address names can be shown. ", h("a", { href: "/jobs" }, "Pick jobs in the list"), "."));
      return;
    }
    figure.hidden = false;
    table.hidden = false;
    renderTable();
    draw();
  }

  function showProblems(problems: string[]): void {
    if (problems.length === 0) {
      replace(problemsEl);
      return;
    }
    replace(problemsEl, h("div", { class: "warn-box", role: "alert" }, h("strong", null, "Not everything this address names can be compared:"), h("ul", null, problems.map((p) => h("li", null, p)))));
  }

  function renderTable(): void {
    replace(
      tbody,
      drawn.map((run) => {
        const job = run.job as Job;
        const last = lastLoss(run.records);
        const ev = [...run.records].reverse().find((r) => typeof r.eval_loss === "number" && Number.isFinite(r.eval_loss));
        const resumes = resumeSteps(run.records);
        return h(
          "tr",
          { dataset: { jobId: String(run.id) } },
          h("td", null, h("span", { class: "swatch", style: `background:${run.colour}`, "aria-hidden": "true" })),
          h("td", null, h("a", { href: `/jobs/${run.id}` }, `#${run.id}`), job.name ? ` ${job.name}` : ""),
          h("td", null, jobStatusBadge(job)),
          h("td", { class: "num" }, `${run.records.length ? run.records[run.records.length - 1].step : 0} / ${job.steps}`),
          h("td", { class: "num", title: last ? `at step ${last.step}, nats/token` : undefined }, last ? num(last.loss, 4) : "–"),
          h("td", { class: "num", title: ev ? `at step ${ev.step}, nats/token` : "The job did not evaluate." }, ev ? num(ev.eval_loss, 4) : "–"),
          h("td", null, resumes.length ? resumes.join(", ") : "–"),
        );
      }),
    );
    const running = drawn.filter((r) => !TERMINAL_STATUSES.has(String(r.job?.status)));
    replace(
      infoEl,
      running.length ? h("p", null, `${running.map(jobLabel).join(", ")} ${running.length > 1 ? "are" : "is"} not finished: the curves are as of ${new Date().toLocaleTimeString()}; Refresh reads the newer steps.`) : null,
      drawn.some((r) => r.records.length === 0) ? h("p", null, `No step yet: ${drawn.filter((r) => r.records.length === 0).map(jobLabel).join(", ")}.`) : null,
    );
  }

  function draw(): void {
    if (stopped || drawn.length === 0) return;
    data = overlay(
      drawn.map((r) => r.records),
      { log },
    );
    const ov = data;
    plot?.destroy();
    plot = null;
    replace(plotEl);
    const series: uPlot.Series[] = [{ label: "step", value: (_u, v) => (v === null || v === undefined ? "–" : String(v)) }];
    const cols: (number | null)[][] = [];
    lossSeries = [];
    drawn.forEach((run, k) => {
      const lastEval = [...ov.evalLoss[k]].reverse().find((v) => v !== null) ?? null;
      cols.push(ov.loss[k]);
      lossSeries.push(series.length);
      series.push({
        label: jobLabel(run),
        stroke: run.colour,
        width: 2,
        points: { show: false },
        // off the chart the legend reads each job's own last loss (the shared axis may run past its end)
        value: (_u, v, _s, idx) => (idx === null || idx === undefined ? (ov.last[k] ? num(ov.last[k]?.loss, 4) : "–") : typeof v === "number" ? num(v, 4) : "–"),
      });
      if (ov.hasEval[k]) {
        cols.push(ov.evalLoss[k]);
        series.push({
          label: `${jobLabel(run)} eval`,
          stroke: run.colour,
          width: 2,
          dash: [6, 4],
          spanGaps: true,
          points: { show: true, size: 6, stroke: run.colour, fill: "#ffffff", width: 1.5 },
          value: (_u, v, _s, idx) => (idx === null || idx === undefined ? (lastEval !== null ? num(lastEval, 4) : "–") : typeof v === "number" ? num(v, 4) : "–"),
        });
      }
    });
    const range = (u: uPlot): [number, number] => {
      const shown = cols.filter((_, i) => u.series?.[i + 1]?.show !== false);
      const ext = autoExtent(shown, false, log);
      if (log) return ext ? logRange(ext.min, ext.max) : [0.1, 10];
      return ext ? linearRange(ext.min, ext.max) : [0, 1];
    };
    const labelledOnly = (u: uPlot, splits: number[]) => {
      const labels = logTickLabels(splits, u.bbox.height / devicePixelRatio);
      return splits.map((v, i) => (labels[i] ? v : null));
    };
    const opts: uPlot.Options = {
      ...size(),
      scales: { x: { time: false }, y: log ? { auto: true, distr: 3, log: 10, range } : { auto: true, range } },
      axes: [
        // steps are whole numbers: never a tick at step 2.5
        { label: "step", size: 36, labelSize: 16, incrs: [0, 1, 2, 3, 4, 5, 6].flatMap((e) => [1, 2, 5].map((m) => m * 10 ** e)) },
        {
          scale: "y",
          label: log ? "loss (log)" : "loss",
          labelSize: 16,
          size: (_u, values) => Math.max(40, 22 + 7 * Math.max(0, ...(values ?? []).map((v) => String(v).length))),
          ...(log ? { grid: { filter: labelledOnly }, ticks: { filter: labelledOnly } } : {}),
          values: log ? (u, splits) => logTickLabels(splits, u.bbox.height / devicePixelRatio) : (_u, splits) => splits.map(axisNum),
        },
      ],
      series,
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: false } },
      hooks: { draw: [(u) => drawResumes(u)] },
    };
    plot = new uPlot(opts, [ov.steps, ...cols] as uPlot.AlignedData, plotEl);
    plot.setLegend({ idx: null as unknown as number });
    (window.__slidedpCharts ??= {})[CHART_ID] = plot;
    figure.dataset.jobs = String(drawn.length);
    figure.dataset.drawn = String(ov.steps.length);
    figure.dataset.log = String(log);
    figure.dataset.resumes = JSON.stringify(Object.fromEntries(drawn.map((r, k) => [r.id, ov.resumes[k]])));
    plotEl.setAttribute("role", "img");
    plotEl.setAttribute(
      "aria-label",
      `Loss by step of ${drawn.length} job${drawn.length > 1 ? "s" : ""}: ` +
        drawn.map((r, k) => `${jobLabel(r)}, ${r.records.length} steps${ov.last[k] ? `, last loss ${num(ov.last[k]?.loss, 4)}` : ""}${ov.resumes[k].length ? `, resumed at step ${ov.resumes[k].join(", ")}` : ""}`).join("; "),
    );
  }

  /** A dotted rule in the job's colour at each step where one of its later attempts resumed. */
  function drawResumes(u: uPlot): void {
    if (!data) return;
    const ctx = u.ctx;
    const { top, height } = u.bbox;
    const dpr = devicePixelRatio;
    const [x0, x1] = [u.scales.x.min ?? -Infinity, u.scales.x.max ?? Infinity];
    ctx.save();
    ctx.lineWidth = Math.max(1, 1.5 * dpr);
    ctx.setLineDash([2 * dpr, 3 * dpr]);
    ctx.font = `${11 * dpr}px system-ui, sans-serif`;
    drawn.forEach((run, k) => {
      if (u.series[lossSeries[k]]?.show === false) return;
      for (const step of data?.resumes[k] ?? []) {
        if (step < x0 || step > x1) continue;
        const x = Math.round(u.valToPos(step, "x", true));
        ctx.strokeStyle = run.colour;
        ctx.fillStyle = run.colour;
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
        ctx.fillText(`resumed #${run.id}`, x + 3, top + (12 + 12 * (k % 3)) * dpr);
      }
    });
    ctx.restore();
  }

  void load();
  return () => {
    stopped = true;
    resize.disconnect();
    if (window.__slidedpCharts && plot && window.__slidedpCharts[CHART_ID] === plot) delete window.__slidedpCharts[CHART_ID];
    plot?.destroy();
    plot = null;
  };
}

/** The newest step with a finite loss. */
function lastLoss(records: readonly MetricsRecord[]): { step: number; loss: number } | null {
  for (let i = records.length - 1; i >= 0; i--) {
    const v = records[i].loss;
    if (typeof v === "number" && Number.isFinite(v)) return { step: records[i].step, loss: v };
  }
  return null;
}
