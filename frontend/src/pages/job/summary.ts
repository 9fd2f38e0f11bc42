// The job page's summary: progress, the run's clock, its figures (ETA, tokens/s, step time, loss, where and when
// it ran, its output) and the start-up line; the step picture below it follows the same refresh.
import { facts, h, replace } from "../../dom";
import { duration, grouped, jobClock, num, seconds, when } from "../../fmt";
import { annotate } from "../../glossary";
import { tensorboardFact } from "../../trackers";
import type { Job, MetricsRecord } from "../../types";
import { progress } from "../../ui";
import type { stepPicture } from "../jobstep";
import type { StartupPanel } from "./startup";

export interface SummaryPanel {
  readonly el: HTMLElement;
  render(job: Job, records: readonly MetricsRecord[]): void;
  /** The run's clock, each second: elapsed while it runs (ticking), the run's duration once it ended. */
  tick(job: Job): void;
  /** A note in place of the summary (no API to read the job from). */
  say(text: string): void;
}

export function summaryPanel(startup: StartupPanel, stepView: ReturnType<typeof stepPicture>): SummaryPanel {
  const el = h("div", { class: "summary" });
  const clockEl = h("dl", { class: "facts clock", id: "job-clock" });

  function tick(job: Job): void {
    const items = jobClock(job);
    replace(
      clockEl,
      items.map((c) => [h("dt", { title: c.hint, class: "term" }, c.label), h("dd", { dataset: { clock: c.label } }, duration(c.seconds))]),
    );
    clockEl.hidden = items.length === 0;
  }

  function render(job: Job, records: readonly MetricsRecord[]): void {
    const m = job.last_metrics ?? null;
    const tokens = m?.tokens_per_s ?? job.tokens_per_s;
    const dl = facts([
      ["ETA", job.status === "running" ? duration(job.eta_s) : null],
      ["tokens/s", typeof tokens === "number" ? grouped(tokens) : null],
      ["step time", m && typeof m.step_time_s === "number" ? seconds(m.step_time_s) : null],
      ["loss", m && "loss" in m ? num(m.loss ?? NaN, 4) : null],
      ["host", job.host],
      ["created", when(job.created_at)],
      ["started", job.started_at ? when(job.started_at) : null],
      ["finished", job.finished_at ? when(job.finished_at) : null],
      ["output", h("code", null, job.output_dir)],
      ["TensorBoard", tensorboardFact(job)], // config report_to: the event files and the command that serves them
    ]);
    annotate(dl);
    replace(el, progress(job.step ?? 0, job.steps ?? 0), clockEl, dl, startup.summaryLine(job));
    stepView.update(job, records);
    tick(job);
  }

  return { el, render, tick, say: (text) => replace(el, h("p", { class: "muted" }, text)) };
}
