// The job page's start-up: where the job is before its first step (the stage, its progress, the time in it and
// since the start), and once it trains, the line that says how long the start took and where.
import { h, replace } from "../../dom";
import { duration } from "../../fmt";
import { stageHeadline, stageHint, stageProgress, startingStage, startupSummary, tenths } from "../../stage";
import { TERMINAL_STATUSES, type Job, type LogLine, type StatusEvent } from "../../types";

export interface StartupPanel {
  /** The stage panel, shown until the first step. */
  readonly el: HTMLElement;
  /** Date the stage the runtime's "start-up: ..." log lines begin; true when the shown stage's start moved. */
  noteLogLines(lines: LogLine[]): boolean;
  /** A status event: a "queued" one restarts the queued clock (a resumed job waits again from then). */
  noteStatus(ev: StatusEvent): void;
  /** Where the job is before its first step, in words, with the time in this stage and since the start. */
  render(job: Job, hasMetrics: boolean): void;
  /** The clocks of the shown stage, each second. */
  tick(job: Job, hasMetrics: boolean): void;
  /** "Start-up: 12.3 s (planning 0.4 s, ...)" once the job trains; where the start ended when it never did. */
  summaryLine(job: Job): HTMLElement | null;
}

export function startupPanel(): StartupPanel {
  const el = h("section", { class: "startup", id: "job-stage", "aria-label": "Start-up", hidden: true });
  const clockEl = h("dl", { class: "facts stage-clock" });
  // When the shown start-up stage began: the newest "start-up: ..." log line of the runtime (written as each
  // stage begins, so a reloaded page knows too), else when this page first saw the stage.
  let startupLine: { seq: number; at: number } | null = null;
  let seenStage = { key: "", at: 0 };
  // When the job was last queued (its newest "queued" status event): a resumed job waits again from then.
  let queuedAt: number | null = null;

  /** When the shown stage began (ms): the process's start for "preparing", the newest start-up log line of this
   *  attempt for the runtime's stages, else when this page first saw it. */
  function stageStart(stage: string, started: number): number {
    if (stage === "launching" || stage === "preparing") return Number.isFinite(started) ? started : seenStage.at;
    if (startupLine && (!Number.isFinite(started) || startupLine.at >= started - 1000)) return startupLine.at;
    return seenStage.at;
  }

  function tick(job: Job, hasMetrics: boolean): void {
    if (el.hidden) return;
    const s = startingStage(job, hasMetrics);
    if (!s) return;
    const now = Date.now();
    const since = (t: number | null) => (t === null || !Number.isFinite(t) ? null : Math.max(0, (now - t) / 1000));
    const items: [string, string, number | null, string][] = [];
    if (s.stage === "queued") {
      const created = job.created_at ? Date.parse(job.created_at) : NaN;
      items.push(["queued for", "queued", since(queuedAt ?? created), "Time since the job was submitted or resumed; it starts when the worker takes it."]);
    } else {
      const started = job.started_at ? Date.parse(job.started_at) : NaN;
      items.push(["in this stage", "stage", since(stageStart(s.stage, started)), "Time since this stage began."]);
      items.push(["start-up so far", "startup", since(started), "Time since the worker started this attempt."]);
    }
    replace(
      clockEl,
      items.filter((i) => i[2] !== null).map(([label, key, sec, hint]) => [h("dt", { title: hint, class: "term" }, label), h("dd", { dataset: { clock: key } }, duration(sec))]),
    );
  }

  function render(job: Job, hasMetrics: boolean): void {
    const s = startingStage(job, hasMetrics);
    if (!s) {
      if (!el.hidden) {
        el.hidden = true;
        replace(el);
        delete el.dataset.stage;
      }
      return;
    }
    if (s.stage !== seenStage.key) seenStage = { key: s.stage, at: Date.now() };
    const frac = stageProgress(s);
    el.hidden = false;
    el.dataset.stage = s.stage;
    replace(
      el,
      h("p", { class: "stage-now" }, h("span", { class: "stage-name term", title: stageHint(s.stage) }, stageHeadline(s))),
      frac !== null
        ? h("progress", { class: "stage-progress", max: 1000, value: Math.round(frac * 1000), "aria-label": `${s.stage.replace(/_/g, " ")}: ${Math.round(frac * 100)} %` })
        : null,
      clockEl,
    );
    tick(job, hasMetrics);
  }

  function noteLogLines(lines: LogLine[]): boolean {
    let changed = false;
    for (const l of lines) {
      if (!l || typeof l.line !== "string" || !l.line.startsWith("start-up: ")) continue;
      const at = Date.parse(l.ts);
      if (Number.isFinite(at) && (!startupLine || l.seq > startupLine.seq)) {
        startupLine = { seq: l.seq, at };
        changed = true;
      }
    }
    return changed;
  }

  function noteStatus(ev: StatusEvent): void {
    const at = ev.ts ? Date.parse(ev.ts) : NaN;
    if (ev.status === "queued" && Number.isFinite(at)) queuedAt = at;
  }

  return { el, noteLogLines, noteStatus, render, tick, summaryLine };
}

function summaryLine(job: Job): HTMLElement | null {
  const sum = startupSummary(job.stage);
  if (sum) {
    const parts = sum.parts.map((p) => h("span", { class: "term", title: p.hint, dataset: { stage: p.stage } }, `${p.label} ${tenths(p.seconds)}`));
    return h(
      "p",
      { class: "startup-summary", id: "startup-summary", dataset: { complete: "true" } },
      h("span", { class: "term", title: "From the start of training (planning) to the end of the first step; loading the runtime before it is not counted. Each stage's share follows." }, "Start-up"),
      `: ${tenths(sum.total)}`,
      parts.length ? [" (", parts.flatMap((p, i) => (i ? [", ", p] : [p])), ")"] : null,
    );
  }
  const s = job.stage;
  if (TERMINAL_STATUSES.has(job.status) && job.status !== "completed" && s && typeof s.stage === "string" && s.stage !== "training") {
    const where = stageHeadline(s);
    return h(
      "p",
      { class: "startup-summary", id: "startup-summary", dataset: { complete: "false" } },
      "The start-up did not finish: the job ended while ",
      h("span", { class: "term", title: stageHint(s.stage) }, where.charAt(0).toLowerCase() + where.slice(1)),
      ".",
    );
  }
  return null;
}
