// Job page: where the job's start-up is, live charts over SSE, the chosen policy and why, log tail, checkpoints and
// export; a diverged run's reason at the top, a cancel asked for as long as it is pending. Its parts are in job/
// (head and actions, summary, start-up, problems, log, checkpoints) and beside it (generate.ts, jobstep.ts); this
// module lays them out and keeps them fed: the job from the API every few seconds, its events from the stream.
import { allMetrics, api, ApiError, apiToken, withTicket } from "../api";
import { JOB_CHARTS, LiveChart } from "../charts";
import { h, replace } from "../dom";
import { annotate, CHART_TERMS, glossaryEntries, PHASE_TERMS, POLICY_TERMS, STAGE_TERMS } from "../glossary";
import { apiAbsent } from "../health";
import { parseJson } from "../json";
import { renderPlan } from "../plan";
import { type Cleanup } from "../router";
import { MetricsStore } from "../series";
import { stageAhead } from "../stage";
import { ResumableStream } from "../sse";
import { TERMINAL_STATUSES, type Job, type JobStage, type JobWarning, type LogLine, type MetricsRecord, type StatusEvent } from "../types";
import { errorBox } from "../ui";
import { generatePanel } from "./generate";
import { checkpointsPanel } from "./job/checkpoints";
import { jobHeader } from "./job/header";
import { allLogs, LogTail } from "./job/log";
import { problemsPanel } from "./job/problems";
import { JobReads, type ReadOutcome } from "./job/reads";
import { startupPanel } from "./job/startup";
import { summaryPanel } from "./job/summary";
import { stepPicture } from "./jobstep";

const REFRESH_MS = 3000;
const CLOCK_MS = 1000;

declare global {
  interface Window {
    __slidedpStream?: ResumableStream | null;
    __slidedpStore?: MetricsStore;
  }
}

export function jobPage(root: HTMLElement, params: string[]): Cleanup {
  const id = Number(params[0]);
  let job: Job | null = null;
  let stopped = false;
  let stream: ResumableStream | null = null;
  let lastEventId: string | null = null;
  // The job read again every few seconds and when the stream says its status changed (pages/job/reads.ts).
  const reads = new JobReads(readJob, REFRESH_MS);
  const store = new MetricsStore();
  window.__slidedpStore = store;
  const charts = JOB_CHARTS.map((spec) => new LiveChart(spec, store));
  const logs = new LogTail();

  const header = jobHeader(id, { job: () => job, setJob: (j) => (job = j), lastStep: () => store.lastStep, renderAll, startStream, holdReads, resumeReads });
  const startup = startupPanel();
  const problems = problemsPanel();
  const stepView = stepPicture(); // the plan's one step with the measured one over it (pages/jobstep.ts)
  const summary = summaryPanel(startup, stepView);
  const policy = policyPanel();
  const checkpoints = checkpointsPanel(id);
  const configEl = h("pre");
  const generate = generatePanel(id); // the prompt box: try the trained model (pages/generate.ts)

  replace(
    root,
    header.el,
    problems.divergedEl,
    summary.el,
    startup.el,
    problems.errorEl,
    problems.warningsEl,
    h("section", { class: "charts", "aria-label": "Live charts" }, charts.map((c) => c.el)),
    glossaryList(),
    h(
      "div",
      { class: "two-col" },
      h("section", { "aria-labelledby": "policy-h" }, h("h2", { id: "policy-h" }, "Policy and why"), policy.el),
      h("section", { "aria-labelledby": "log-h" }, h("h2", { id: "log-h" }, "Log"), logs.el),
    ),
    stepView.el,
    h("section", { "aria-labelledby": "ckpt-h" }, h("h2", { id: "ckpt-h" }, "Checkpoints and export"), checkpoints.el),
    generate.el,
    h("details", { class: "raw" }, h("summary", null, "Job config"), configEl),
  );

  const renderSummary = () => job && summary.render(job, store.records);
  const renderStage = () => job && startup.render(job, store.length > 0);

  function renderAll(): void {
    if (!job) return;
    header.render(job);
    summary.render(job, store.records);
    startup.render(job, store.length > 0);
    problems.renderError(job);
    problems.renderWarnings(job);
    for (const c of charts) c.setContext({ job });
    generate.update(job);
    policy.update(job);
    const config = JSON.stringify(job.config, null, 2);
    if (configEl.textContent !== config) configEl.textContent = config;
  }

  // ------------------------------------------------------------------ what the stream and the reads bring
  function onMetrics(recs: MetricsRecord[]): void {
    if (store.addMany(recs) === 0) return;
    for (const c of charts) c.update();
    if (job) {
      job.step = Math.max(job.step ?? 0, store.lastStep);
      job.last_metrics = store.records[store.length - 1];
      renderSummary();
      renderStage();
    }
  }

  /** Log lines into the tail; the runtime's "start-up: ..." lines also date the stage they begin. */
  function addLogs(lines: LogLine[]): void {
    logs.add(lines);
    if (startup.noteLogLines(lines)) renderStage();
  }

  function onStatus(ev: StatusEvent): void {
    if (!job || stopped) return;
    // A stream opened from the start replays a resumed job's earlier attempts; their end is not this one's.
    if (TERMINAL_STATUSES.has(ev.status) && !TERMINAL_STATUSES.has(job.status) && ev.ts && job.started_at && Date.parse(ev.ts) < Date.parse(job.started_at)) return;
    const at = ev.ts ? Date.parse(ev.ts) : NaN;
    startup.noteStatus(ev);
    // The attempt starts with its "running" event: its clock too, before the next refresh brings started_at.
    if (ev.status === "running" && Number.isFinite(at) && (!job.started_at || at > Date.parse(job.started_at))) job.started_at = ev.ts ?? null;
    job.status = ev.status;
    if (ev.error) job.error = ev.error;
    header.render(job);
    problems.renderError(job);
    renderStage();
    if (TERMINAL_STATUSES.has(ev.status)) {
      stream?.end();
      header.setLive("final");
    }
    void reads.now(true);
  }

  /** A health warning as the stream sends it (after its step's metrics): marked now, not at the next refresh. */
  function onWarning(w: JobWarning): void {
    if (!job || !w || typeof w.step !== "number") return;
    const list = Array.isArray(job.warnings) ? job.warnings : [];
    if (list.some((x) => x.step === w.step && x.kind === w.kind)) return;
    job.warnings = [...list, w];
    problems.renderWarnings(job);
    header.renderBadge(job);
    for (const c of charts) c.setContext({ job });
  }

  /** A start-up stage as the stream sends it: where the attempt is now; "training" ends the start-up line. */
  function onStage(st: JobStage): void {
    if (!job || !st || typeof st.stage !== "string") return;
    job.stage = st;
    renderStage();
    if (st.stage === "training" || TERMINAL_STATUSES.has(job.status)) renderSummary();
  }

  /** Everything the stream may have missed: metrics after the last contiguous step, and newer log lines. */
  async function catchUp(): Promise<void> {
    const [recs, lines] = await Promise.all([allMetrics(id, store.contiguousStep()), allLogs(id, logs.lastSeq)]);
    if (stopped) return;
    onMetrics(recs);
    addLogs(lines);
  }

  // ------------------------------------------------------------------ following the job
  function startStream(): void {
    // A page left (stopped) opens no stream: one opened after its cleanup would follow the job, and ask for it
    // again after it is deleted, until the browser tab closes.
    if (stopped) return;
    if (stream && stream.state !== "ended" && stream.state !== "closed") return;
    lastEventId = stream?.lastEventId ?? lastEventId;
    stream = new ResumableStream(api.eventsUrl(id), {
      onEvent(type, data) {
        let payload: unknown;
        try {
          payload = parseJson(data);
        } catch {
          return;
        }
        if (type === "metrics") onMetrics([payload as MetricsRecord]);
        else if (type === "log") addLogs([payload as LogLine]);
        else if (type === "status") onStatus(payload as StatusEvent);
        else if (type === "warning") onWarning(payload as JobWarning);
        else if (type === "stage") onStage(payload as JobStage);
      },
      onState: header.setLive,
      onReopen: () => void catchUp().catch(() => undefined),
    }, { events: ["metrics", "status", "log", "warning", "stage"], ...(apiToken() ? { sign: (url: string) => withTicket(url) } : {}) });
    // A stream reopened after a resume continues after the last event this page saw.
    stream.lastEventId = lastEventId;
    window.__slidedpStream = stream;
    stream.start();
  }

  async function readJob(withCatchUp: boolean): Promise<ReadOutcome> {
    try {
      const fresh = await api.job(id);
      if (stopped) return "done";
      const prev = job;
      job = { ...fresh, step: Math.max(fresh.step ?? 0, store.lastStep) };
      // Read before the stream's newest stage event of this attempt: that event stays.
      if (prev && prev.status === "running" && fresh.status === "running" && prev.started_at === fresh.started_at && stageAhead(prev.stage, fresh.stage)) job.stage = prev.stage;
      if (!job.last_metrics && store.length) job.last_metrics = store.records[store.length - 1];
      renderAll();
      const live = stream?.state === "open";
      if (withCatchUp || !live) await catchUp();
      if (stopped) return "done";
      if (TERMINAL_STATUSES.has(job.status)) {
        stream?.end();
        header.setLive("final");
        await checkpoints.load(() => stopped);
        return "done";
      }
      if (!stream || stream.state === "ended" || stream.state === "closed") startStream();
    } catch (err) {
      if (stopped) return "done";
      if (err instanceof ApiError && err.status === 404) {
        replace(root, h("h1", null, `Job #${id}`), h("p", null, "There is no such job (it may have been deleted). ", h("a", { href: "/jobs" }, "All jobs")));
        stopped = true;
        return "done";
      }
      problems.showError(errorBox(err, "the job"));
    }
    return stopped ? "done" : "again";
  }

  /** Before a delete: no read of the job from now on, and none still on its way (it would answer 404). */
  async function holdReads(): Promise<void> {
    await reads.hold();
    await loaded;
  }

  function resumeReads(): void {
    if (!stopped) reads.resume();
  }

  async function load(): Promise<void> {
    if (await apiAbsent()) {
      summary.say("This job appears once the API answers.");
      return;
    }
    try {
      job = await api.job(id);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        replace(root, h("h1", null, `Job #${id}`), h("p", null, "There is no such job. ", h("a", { href: "/jobs" }, "All jobs")));
      } else problems.showError(errorBox(err, "the job"));
      return;
    }
    if (stopped) return;
    renderAll();
    // Open the stream before reading the history so nothing falls between the two; the store merges by step.
    if (!TERMINAL_STATUSES.has(job.status)) startStream();
    else header.setLive("final");
    try {
      await catchUp();
    } catch (err) {
      if (!stopped) problems.showError(errorBox(err, "the metrics"));
    }
    await checkpoints.load(() => stopped);
    if (!stopped) reads.later();
  }

  const clock = setInterval(() => {
    if (job && (job.status === "running" || job.status === "queued")) {
      summary.tick(job);
      startup.tick(job, store.length > 0);
    }
  }, CLOCK_MS);

  const loaded = load();
  return () => {
    stopped = true;
    void reads.hold();
    clearInterval(clock);
    lastEventId = stream?.lastEventId ?? null;
    stream?.close();
    if (window.__slidedpStream === stream) window.__slidedpStream = null;
    for (const c of charts) c.destroy();
  };
}

/** The job's plan and policy (docs/interfaces.md §5), redrawn only when it changed, so an opened "Raw JSON" stays
 *  open. */
function policyPanel(): { el: HTMLElement; update: (job: Job) => void } {
  const el = h("div", { class: "policy" }, h("p", { class: "muted" }, "No policy yet: it is resolved when the job starts."));
  let shown = "";
  return {
    el,
    update(job) {
      const policy = JSON.stringify(job.policy ?? null);
      if (job.policy && Object.keys(job.policy).length && shown !== policy) {
        shown = policy;
        replace(el, renderPlan(job.policy, { title: "Policy" }));
        annotate(el);
      }
    },
  };
}

/** Every name the charts and the policy panel use, with what it means (the same text as their hover titles). */
function glossaryList(): HTMLElement {
  const group = (title: string, entries: [string, string][]) => [h("h3", null, title), h("dl", { class: "facts glossary-list" }, entries.map(([k, v]) => [h("dt", null, k), h("dd", null, v)]))];
  return h(
    "details",
    { class: "glossary", id: "glossary" },
    h("summary", null, "What the names mean"),
    group("Phases of a step", glossaryEntries([PHASE_TERMS])),
    group("Chart lines and figures", glossaryEntries([CHART_TERMS])),
    group("Policy", glossaryEntries([POLICY_TERMS])),
    group("Stages of the start", glossaryEntries([STAGE_TERMS])),
  );
}
