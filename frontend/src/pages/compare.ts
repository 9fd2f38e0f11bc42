// Compare page: what differs in the compared jobs' configs, and their loss (eval loss dashed), gradient norm, step
// time and tokens/s on one step axis each, every job in its own colour, a resumed job's attempts joined into one
// line with a rule where it resumed. Each axis turns logarithmic when its values span decades, and a diverged run's
// points above the others' are marked at the top edge instead of setting the scale (comparison.ts). The selection
// and the axes chosen by hand are the URL (`/jobs/compare?ids=3,5&log=1`, overlay.ts), so a reload or a shared
// link shows the same.
// The curves are read once when the page opens (and on Refresh): the job page is the live view of one run.
import uPlot from "uplot";
import { allMetrics, api, ApiError } from "../api";
import { logTickLabels, PALETTE } from "../charts";
import { h, replace } from "../dom";
import { axisNum, num } from "../fmt";
import { apiAbsent } from "../health";
import { clipText, COMPARED_METRICS, configDiff, viewOf, type ComparedMetric, type View } from "../comparison";
import { compareHref, overlay, parseSelection, resumeSteps, type Overlay } from "../overlay";
import type { Cleanup } from "../router";
import { linearRange, logRange, MetricsStore } from "../series";
import { TERMINAL_STATUSES, type Job, type MetricsRecord } from "../types";
import { errorBox, jobStatusBadge } from "../ui";

const HEIGHT = 300;

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
  // the axes chosen by hand (URL parameter -> log); a chart not named picks its own
  const scales: Record<string, boolean> = { ...sel.scales };
  let stopped = false;
  let runs: Run[] = [];
  let drawn: Run[] = [];

  const refresh = h("button", { type: "button", class: "secondary" }, "Refresh");
  const problemsEl = h("div", { id: "compare-problems" });
  const messageEl = h("div", { class: "page-message" });
  const infoEl = h("div", { class: "chart-info" });
  const diffEl = h("section", { class: "compare-diff", id: "compare-config", "aria-labelledby": "compare-config-h" });
  const tbody = h("tbody");
  const table = h(
    "table",
    { class: "compare-table", id: "compare-runs" },
    h("caption", null, "Compared jobs"),
    h("thead", null, h("tr", null, ["", "Job", "Status", "Steps", "Final loss", "Final eval loss", "Resumed at step"].map((c) => h("th", { scope: "col" }, c)))),
    tbody,
  );
  const back = h("a", { class: "button", href: sel.ids.length ? `/jobs?select=${sel.ids.join(",")}` : "/jobs" }, "Change selection");
  const charts = COMPARED_METRICS.map((m) => chart(m));
  const chartsEl = h("div", { class: "compare-charts" }, charts.map((c) => c.figure));

  replace(
    root,
    h("div", { class: "page-head" }, h("h1", null, "Compare jobs"), h("div", { class: "toolbar" }, back, refresh)),
    problemsEl,
    messageEl,
    infoEl,
    diffEl,
    chartsEl,
    h("div", { class: "table-wrap" }, table),
  );
  refresh.addEventListener("click", () => void load());

  function showAll(on: boolean): void {
    chartsEl.hidden = !on;
    table.hidden = !on;
    diffEl.hidden = !on;
  }

  async function load(): Promise<void> {
    if (sel.ids.length === 0) {
      showProblems(sel.problems);
      showAll(false);
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
      showAll(false);
      if (!runs.some((r) => r.error !== null)) messageEl.append(h("p", { class: "error-box", role: "alert" }, "None of the jobs this address names can be shown. ", h("a", { href: "/jobs" }, "Pick jobs in the list"), "."));
      return;
    }
    showAll(true);
    renderTable();
    renderDiff();
    for (const c of charts) c.draw();
  }

  function showProblems(problems: string[]): void {
    if (problems.length === 0) {
      replace(problemsEl);
      return;
    }
    replace(problemsEl, h("div", { class: "warn-box", role: "alert" }, h("strong", null, "Not everything this address names can be compared:"), h("ul", null, problems.map((p) => h("li", null, p)))));
  }

  /** What differs in the jobs' configs: one row per differing key, a column per job. */
  function renderDiff(): void {
    const rows = configDiff(drawn.map((r) => r.job?.config ?? {}));
    const head = h("h2", { id: "compare-config-h" }, "What differs in their configs");
    if (drawn.length < 2) {
      replace(diffEl, head, h("p", { class: "muted" }, "One job: nothing to tell apart."));
      return;
    }
    if (rows.length === 0) {
      replace(diffEl, head, h("p", { class: "muted", dataset: { rows: "0" } }, "Their configs are the same (the output folder aside): the runs differ only by chance or by the host they ran on."));
      return;
    }
    replace(
      diffEl,
      head,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "compare-table config-diff", dataset: { rows: String(rows.length) } },
          h("thead", null, h("tr", null, h("th", { scope: "col" }, "Setting"), drawn.map((r) => h("th", { scope: "col" }, h("span", { class: "swatch", style: `background:${r.colour}`, "aria-hidden": "true" }), ` ${jobLabel(r)}`)))),
          h(
            "tbody",
            null,
            rows.map((row) => h("tr", { dataset: { key: row.key } }, h("th", { scope: "row", title: row.key }, row.label, " ", h("code", { class: "muted" }, row.key)), row.values.map((v) => h("td", null, v)))),
          ),
        ),
      ),
    );
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

  /** One metric's chart: its figure, and draw() once the runs are read or its axis changed. */
  function chart(metric: ComparedMetric): { figure: HTMLElement; draw: () => void; destroy: () => void } {
    let plot: uPlot | null = null;
    let data: Overlay | null = null;
    let view: View | null = null;
    let lossSeries: number[] = [];
    const boxId = `${metric.chartId}-log`;
    const logBox = h("input", { type: "checkbox", id: boxId, checked: scales[metric.scaleParam] ?? false });
    const plotEl = h("div", { class: "chart-plot" }, h("p", { class: "muted chart-empty" }, "Loading the curves…"));
    const noteEl = h("p", { class: "chart-note muted" });
    const figure = h(
      "figure",
      { class: "chart", id: `chart-${metric.chartId}`, dataset: { jobs: "0", drawn: "0", log: "false", scale: "auto", resumes: "{}", clips: "[]" } },
      h(
        "figcaption",
        null,
        h("span", { class: "chart-title", title: metric.hint }, metric.title),
        h("span", { class: "chart-controls" }, h("label", { class: "check", for: boxId, title: "A logarithmic axis: runs that differ by orders of magnitude stay readable. Chosen by itself when the values span two decades or more; ticking or unticking keeps your choice in the address." }, logBox, "log scale")),
      ),
      noteEl,
      plotEl,
    );
    const resize = new ResizeObserver(() => plot?.setSize(size()));
    resize.observe(plotEl);
    logBox.addEventListener("change", () => {
      scales[metric.scaleParam] = logBox.checked;
      // the choice is part of the comparison a link shares
      history.replaceState(history.state, "", compareHref(sel.ids, scales));
      draw();
    });

    function size(): { width: number; height: number } {
      return { width: Math.max(280, plotEl.clientWidth), height: HEIGHT };
    }

    function draw(): void {
      if (stopped || drawn.length === 0) return;
      const explicit = scales[metric.scaleParam] ?? null;
      // the view decides the axis from every finite value; a log axis then gaps the values <= 0
      const lin = overlay(drawn.map((r) => r.records), { key: metric.key, evalKey: metric.evalKey });
      const cols = (o: Overlay) => drawn.flatMap((_r, k) => [{ run: k, values: o.values[k] }, ...(o.hasEval[k] ? [{ run: k, values: o.evalValues[k] }] : [])]);
      const nonFinite = metric.nonFiniteDiverges ? lin.nonFinite : [];
      const first = viewOf(lin.steps, cols(lin), nonFinite, explicit);
      const ov = first.log ? overlay(drawn.map((r) => r.records), { key: metric.key, evalKey: metric.evalKey, log: true }) : lin;
      data = ov;
      const shownCols = cols(ov);
      const seriesView = (u: uPlot | null): View => viewOf(ov.steps, shownCols.filter((_c, i) => u?.series?.[i + 1]?.show !== false), nonFinite, first.log);
      view = seriesView(null);
      logBox.checked = first.log;
      const fmt = (v: number) => num(v, metric.digits);
      plot?.destroy();
      plot = null;
      replace(plotEl);
      const series: uPlot.Series[] = [{ label: "step", value: (_u, v) => (v === null || v === undefined ? "–" : String(v)) }];
      const data2: (number | null)[][] = [];
      lossSeries = [];
      drawn.forEach((run, k) => {
        const lastEval = [...ov.evalValues[k]].reverse().find((v) => v !== null) ?? null;
        data2.push(ov.values[k]);
        lossSeries.push(series.length);
        series.push({
          label: jobLabel(run),
          stroke: run.colour,
          width: 2,
          points: { show: false },
          // off the chart the legend reads each job's own last value (the shared axis may run past its end)
          value: (_u, v, _s, idx) => (idx === null || idx === undefined ? (ov.last[k] ? fmt(ov.last[k]?.value as number) : "–") : typeof v === "number" ? fmt(v) : "–"),
        });
        if (ov.hasEval[k]) {
          data2.push(ov.evalValues[k]);
          series.push({
            label: `${jobLabel(run)} eval`,
            stroke: run.colour,
            width: 2,
            dash: [6, 4],
            spanGaps: true,
            points: { show: true, size: 6, stroke: run.colour, fill: "#ffffff", width: 1.5 },
            value: (_u, v, _s, idx) => (idx === null || idx === undefined ? (lastEval !== null ? fmt(lastEval) : "–") : typeof v === "number" ? fmt(v) : "–"),
          });
        }
      });
      const log = first.log;
      const range = (u: uPlot): [number, number] => {
        view = seriesView(u);
        if (log) return view.min !== null ? logRange(view.min, view.max) : [0.1, 10];
        return view.min !== null ? linearRange(view.min, view.max) : [0, 1];
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
            label: log ? `${metric.axis} (log)` : metric.axis,
            labelSize: 16,
            size: (_u, values) => Math.max(40, 22 + 7 * Math.max(0, ...(values ?? []).map((v) => String(v).length))),
            ...(log ? { grid: { filter: labelledOnly }, ticks: { filter: labelledOnly } } : {}),
            values: log ? (u, splits) => logTickLabels(splits, u.bbox.height / devicePixelRatio) : (_u, splits) => splits.map(axisNum),
          },
        ],
        series,
        legend: { show: true, live: true },
        cursor: { drag: { x: true, y: false } },
        hooks: { draw: [(u) => drawResumes(u), (u) => placeClipMarks(u)] },
      };
      plot = new uPlot(opts, [ov.steps, ...data2] as uPlot.AlignedData, plotEl);
      plot.setLegend({ idx: null as unknown as number });
      (window.__slidedpCharts ??= {})[metric.chartId] = plot;
      const clips = view.clips.map((c) => ({ job: drawn[c.run].id, step: c.step, value: c.value, text: clipText(drawn[c.run].id, c, fmt, metric.axis) }));
      Object.assign(figure.dataset, {
        jobs: String(drawn.length),
        drawn: String(ov.steps.length),
        log: String(log),
        scale: explicit === null ? "auto" : "chosen",
        resumes: JSON.stringify(Object.fromEntries(drawn.map((r, k) => [r.id, ov.resumes[k]]))),
        clips: JSON.stringify(clips),
      });
      replace(
        noteEl,
        explicit === null && first.autoLog ? "Log axis: the values span two decades or more. " : "",
        clips.length ? `Left out of the scale, marked ▲ at the top: ${clips.map((c) => c.text).join("; ")}.` : "",
      );
      plotEl.setAttribute("role", "img");
      plotEl.setAttribute(
        "aria-label",
        `${metric.title} of ${drawn.length} job${drawn.length > 1 ? "s" : ""}: ` +
          drawn.map((r, k) => `${jobLabel(r)}, ${r.records.length} steps${ov.last[k] ? `, last ${fmt(ov.last[k]?.value as number)}` : ""}${ov.resumes[k].length ? `, resumed at step ${ov.resumes[k].join(", ")}` : ""}`).join("; ") +
          (clips.length ? `. ${clips.map((c) => c.text).join("; ")}` : ""),
      );
    }

    /** A triangle at the top edge over each diverged run's highest left-out point, its words on hover. */
    function placeClipMarks(u: uPlot): void {
      u.over.querySelectorAll(".clip-mark").forEach((el) => el.remove());
      if (!view) return;
      const [x0, x1] = [u.scales.x.min ?? -Infinity, u.scales.x.max ?? Infinity];
      for (const c of view.clips) {
        if (c.step < x0 || c.step > x1 || u.series[lossSeries[c.run]]?.show === false) continue;
        const run = drawn[c.run];
        const text = clipText(run.id, c, (v) => num(v, metric.digits), metric.axis);
        const left = u.valToPos(c.step, "x");
        u.over.append(h("span", { class: "clip-mark", title: text, "aria-label": text, dataset: { job: String(run.id), step: String(c.step) }, style: `left:${left}px;color:${run.colour}` }, "▲"));
      }
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

    return {
      figure,
      draw,
      destroy() {
        resize.disconnect();
        if (window.__slidedpCharts && plot && window.__slidedpCharts[metric.chartId] === plot) delete window.__slidedpCharts[metric.chartId];
        plot?.destroy();
        plot = null;
      },
    };
  }

  void load();
  return () => {
    stopped = true;
    for (const c of charts) c.destroy();
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
