// Job page: where the job's start-up is, live charts over SSE, the chosen policy and why, log tail, checkpoints and
// export; a diverged run's reason at the top, a cancel asked for as long as it is pending.
import { allMetrics, api, ApiError, apiToken, download, withTicket } from "../api";
import { JOB_CHARTS, jobWarnings, LiveChart } from "../charts";
import { facts, h, replace } from "../dom";
import { bytes, duration, grouped, jobClock, num, seconds, when, words } from "../fmt";
import { annotate, CHART_TERMS, glossaryEntries, PHASE_TERMS, POLICY_TERMS, STAGE_TERMS } from "../glossary";
import { apiAbsent } from "../health";
import { parseJson } from "../json";
import { renderPlan } from "../plan";
import { navigate, type Cleanup } from "../router";
import { MetricsStore } from "../series";
import { generatePanel } from "./generate";
import { stepPicture } from "./jobstep";
import { divergence, stageAhead, stageHeadline, stageHint, stageProgress, startingStage, startupSummary, tenths } from "../stage";
import { ResumableStream, type StreamState } from "../sse";
import { tensorboardFact } from "../trackers";
import { TERMINAL_STATUSES, type Job, type JobStage, type JobWarning, type LogLine, type MetricsRecord, type StatusEvent } from "../types";
import { confirmButton, confirmControl, errorBox, jobStatusBadge, progress, runAction } from "../ui";

const LOG_TAIL = 500;
const REFRESH_MS = 3000;
const CLOCK_MS = 1000;

declare global {
  interface Window {
    __slidedpStream?: ResumableStream | null;
    __slidedpStore?: MetricsStore;
  }
}

/** The last lines of a job's log, unique by sequence number. */
class LogTail {
  readonly el = h("pre", { class: "log", tabindex: "0", "aria-label": "Log tail" });
  private lines: LogLine[] = [];
  private pending = false;
  // Follow the newest line unless the reader scrolled up to read something.
  private stick = true;
  constructor() {
    this.el.addEventListener("scroll", () => {
      this.stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 8;
    });
    new ResizeObserver(() => this.follow()).observe(this.el);
  }
  private follow(): void {
    if (this.stick) this.el.scrollTop = this.el.scrollHeight;
  }
  get lastSeq(): number {
    return this.lines.length ? this.lines[this.lines.length - 1].seq : 0;
  }
  add(items: LogLine[]): void {
    let changed = false;
    for (const l of items) {
      if (!l || typeof l.seq !== "number") continue;
      if (this.lines.length === 0 || l.seq > this.lastSeq) this.lines.push(l);
      else if (!this.lines.some((x) => x.seq === l.seq)) {
        this.lines.push(l);
        this.lines.sort((a, b) => a.seq - b.seq);
      } else continue;
      changed = true;
    }
    if (this.lines.length > LOG_TAIL) this.lines.splice(0, this.lines.length - LOG_TAIL);
    if (changed && !this.pending) {
      this.pending = true;
      requestAnimationFrame(() => this.render());
    }
  }
  private render(): void {
    this.pending = false;
    this.el.textContent = this.lines.map((l) => l.line).join("\n");
    this.follow();
  }
}

export function jobPage(root: HTMLElement, params: string[]): Cleanup {
  const id = Number(params[0]);
  let job: Job | null = null;
  let stopped = false;
  let stream: ResumableStream | null = null;
  let lastEventId: string | null = null;
  let timer: ReturnType<typeof setTimeout> | null = null;
  let shownPolicy = "";
  let shownWarnings = "";
  // A cancel this page asked for, or the job's pending one: its note stays until the final status replaces it.
  let cancelAsked: { save: boolean } | null = null;
  // When the shown start-up stage began: the newest "start-up: ..." log line of the runtime (written as each
  // stage begins, so a reloaded page knows too), else when this page first saw the stage.
  let startupLine: { seq: number; at: number } | null = null;
  let seenStage = { key: "", at: 0 };
  // When the job was last queued (its newest "queued" status event): a resumed job waits again from then.
  let queuedAt: number | null = null;
  const store = new MetricsStore();
  window.__slidedpStore = store;
  const charts = JOB_CHARTS.map((spec) => new LiveChart(spec, store));
  const logs = new LogTail();

  const title = h("h1", null, `Job #${id}`);
  const badge = h("span");
  const liveEl = h("span", { class: "live", id: "stream-state", role: "status" });
  const actionsEl = h("div", { class: "actions" });
  const actionOut = h("span", { class: "action-note", role: "status" });
  const summaryEl = h("div", { class: "summary" });
  const divergedEl = h("div", { class: "diverged-slot" });
  const stageEl = h("section", { class: "startup", id: "job-stage", "aria-label": "Start-up", hidden: true });
  const stageClockEl = h("dl", { class: "facts stage-clock" });
  const clockEl = h("dl", { class: "facts clock", id: "job-clock" });
  const errorEl = h("div");
  const warningsEl = h("section", { class: "warnings", "aria-label": "Warnings", hidden: true });
  const policyEl = h("div", { class: "policy" }, h("p", { class: "muted" }, "No policy yet: it is resolved when the job starts."));
  const ckptEl = h("div", null, h("p", { class: "muted" }, "No checkpoints."));
  const configEl = h("pre");
  const generate = generatePanel(id); // the prompt box: try the trained model (pages/generate.ts)
  const stepView = stepPicture(); // the plan's one step with the measured one over it (pages/jobstep.ts)

  replace(
    root,
    h("div", { class: "page-head" }, h("div", { class: "title-row" }, title, badge, liveEl), h("div", { class: "toolbar" }, actionsEl, actionOut)),
    divergedEl,
    summaryEl,
    stageEl,
    errorEl,
    warningsEl,
    h("section", { class: "charts", "aria-label": "Live charts" }, charts.map((c) => c.el)),
    glossaryList(),
    h(
      "div",
      { class: "two-col" },
      h("section", { "aria-labelledby": "policy-h" }, h("h2", { id: "policy-h" }, "Policy and why"), policyEl),
      h("section", { "aria-labelledby": "log-h" }, h("h2", { id: "log-h" }, "Log"), logs.el),
    ),
    stepView.el,
    h("section", { "aria-labelledby": "ckpt-h" }, h("h2", { id: "ckpt-h" }, "Checkpoints and export"), ckptEl),
    generate.el,
    h("details", { class: "raw" }, h("summary", null, "Job config"), configEl),
  );

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
    let changed = false;
    for (const l of lines) {
      if (!l || typeof l.line !== "string" || !l.line.startsWith("start-up: ")) continue;
      const at = Date.parse(l.ts);
      if (Number.isFinite(at) && (!startupLine || l.seq > startupLine.seq)) {
        startupLine = { seq: l.seq, at };
        changed = true;
      }
    }
    if (changed) renderStage();
  }

  function renderHeader(): void {
    if (!job) return;
    title.textContent = `Job #${job.id}${job.name ? ` · ${job.name}` : ""}`;
    replace(badge, jobStatusBadge(job));
    // Rebuilt only when the status or a pending cancel changes: a half-confirmed cancel, a ticked box or the focus
    // survive refreshes.
    const key = `${job.status}|${job.status === "running" ? (job.cancel_request ?? "") : ""}`;
    if (actionsEl.dataset.state === key) return;
    actionsEl.dataset.state = key;
    actionsEl.dataset.status = job.status;
    const out = actionOut;
    replace(actionsEl);
    if (job.status === "running" && job.cancel_request) {
      // Asked for here or elsewhere, before a reload too: said until the job's final status replaces it.
      const save = job.cancel_request === "save";
      cancelAsked = { save };
      actionsEl.append(h("button", { type: "button", class: "secondary", disabled: true }, "Cancel requested…"));
      actionOut.className = "action-note";
      delete actionOut.dataset.outcome;
      actionOut.textContent = cancelNote(save, job.cancel_requested_at);
    } else if (job.status === "queued" || job.status === "running") {
      const save = h("input", { type: "checkbox", id: "cancel-save" });
      const saveLabel = h("label", { class: "check", for: "cancel-save" }, save, " save a checkpoint");
      actionsEl.append(
        saveLabel,
        confirmControl({
          label: "Cancel job",
          confirmLabel: "Confirm cancel",
          keepLabel: "Keep running",
          question: "Stop this job?",
          cls: "secondary",
          doneLabel: "Cancel requested…",
          action: async () => {
            const withSave = save.checked;
            cancelAsked = { save: withSave };
            let fresh: Job;
            try {
              fresh = await api.cancel(id, withSave);
            } catch (err) {
              cancelAsked = null;
              out.className = "action-error";
              out.textContent = (err as Error).message;
              return false;
            }
            // The stream may have said the job ended while the request was on its way: that is newer.
            if (job && !TERMINAL_STATUSES.has(job.status)) job = { ...fresh, step: Math.max(fresh.step ?? 0, store.lastStep) };
            save.disabled = true;
            if (job?.status === "running") {
              actionOut.className = "action-note";
              actionOut.textContent = cancelNote(withSave, job.cancel_requested_at);
            }
            renderAll();
            return true;
          },
        }),
      );
    } else if (cancelAsked) {
      // The job ended: its final status replaces "Cancel requested…".
      const step = Math.max(job.step ?? 0, store.lastStep);
      actionOut.className = "action-note";
      actionOut.dataset.outcome = job.status;
      actionOut.textContent =
        job.status === "cancelled"
          ? `Cancelled at step ${step}.${cancelAsked.save ? " A checkpoint was asked for: the checkpoints are listed below." : ""}`
          : `The job ended as ${job.status} at step ${step} before the cancel took effect.`;
      cancelAsked = null;
    }
    if (job.status === "failed" || job.status === "cancelled" || job.status === "interrupted") {
      const btn = h("button", { type: "button", class: "secondary" }, "Resume");
      btn.addEventListener("click", async () => {
        await runAction(btn, out, async () => {
          job = await api.resume(id);
          renderAll();
          startStream();
        });
      });
      actionsEl.append(btn);
    }
    if (job.status === "completed" && job.config?.export !== false) {
      // The href holds no secret; behind a token the click fetches a one-time ticket and downloads with it.
      const link = h("a", { class: "button", href: api.exportUrl(id), download: true }, "Download export");
      link.addEventListener("click", (ev) => {
        if (!apiToken()) return;
        ev.preventDefault();
        download(api.exportUrl(id)).catch((err: unknown) => {
          out.className = "action-error";
          out.textContent = `Download export: ${(err as Error).message}`;
        });
      });
      actionsEl.append(link);
    }
    if (TERMINAL_STATUSES.has(job.status)) {
      actionsEl.append(
        confirmButton("Delete", "Confirm delete", async () => {
          try {
            await api.remove(id);
            navigate("/jobs");
          } catch (err) {
            out.className = "action-error";
            out.textContent = (err as Error).message;
          }
        }),
      );
    }
  }

  function renderSummary(): void {
    if (!job) return;
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
    replace(summaryEl, progress(job.step ?? 0, job.steps ?? 0), clockEl, dl, startupLineEl());
    stepView.update(job, store.records);
    renderClock();
  }

  /** "Start-up: 12.3 s (planning 0.4 s, ...)" once the job trains; where the start ended when it never did. */
  function startupLineEl(): HTMLElement | null {
    if (!job) return null;
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

  /** Where the job is before its first step, in words, with the time in this stage and since the start. */
  function renderStage(): void {
    if (!job) return;
    const s = startingStage(job, store.length > 0);
    if (!s) {
      if (!stageEl.hidden) {
        stageEl.hidden = true;
        replace(stageEl);
        delete stageEl.dataset.stage;
      }
      return;
    }
    if (s.stage !== seenStage.key) seenStage = { key: s.stage, at: Date.now() };
    const frac = stageProgress(s);
    stageEl.hidden = false;
    stageEl.dataset.stage = s.stage;
    replace(
      stageEl,
      h("p", { class: "stage-now" }, h("span", { class: "stage-name term", title: stageHint(s.stage) }, stageHeadline(s))),
      frac !== null
        ? h("progress", { class: "stage-progress", max: 1000, value: Math.round(frac * 1000), "aria-label": `${s.stage.replace(/_/g, " ")}: ${Math.round(frac * 100)} %` })
        : null,
      stageClockEl,
    );
    renderStageClock();
  }

  function renderStageClock(): void {
    if (!job || stageEl.hidden) return;
    const s = startingStage(job, store.length > 0);
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
      stageClockEl,
      items.filter((i) => i[2] !== null).map(([label, key, sec, hint]) => [h("dt", { title: hint, class: "term" }, label), h("dd", { dataset: { clock: key } }, duration(sec))]),
    );
  }

  /** When the shown stage began (ms): the process's start for "preparing", the newest start-up log line of this
   *  attempt for the runtime's stages, else when this page first saw it. */
  function stageStart(stage: string, started: number): number {
    if (stage === "launching" || stage === "preparing") return Number.isFinite(started) ? started : seenStage.at;
    if (startupLine && (!Number.isFinite(started) || startupLine.at >= started - 1000)) return startupLine.at;
    return seenStage.at;
  }

  /** Elapsed while it runs (ticking), the run's duration once it ended. */
  function renderClock(): void {
    if (!job) return;
    const items = jobClock(job);
    replace(
      clockEl,
      items.map((c) => [h("dt", { title: c.hint, class: "term" }, c.label), h("dd", { dataset: { clock: c.label } }, duration(c.seconds))]),
    );
    clockEl.hidden = items.length === 0;
  }

  function renderWarnings(): void {
    const list = jobWarnings(job);
    const key = JSON.stringify(list);
    if (key === shownWarnings) return;
    shownWarnings = key;
    warningsEl.hidden = list.length === 0;
    replace(
      warningsEl,
      list.length
        ? [
            h("h2", { title: CHART_TERMS.warning.text }, `Warnings (${list.length})`),
            h("ul", null, list.map((w) => h("li", null, h("strong", null, `step ${w.step}`), ` · ${words(w.kind)}: ${w.message}`))),
          ]
        : [],
    );
  }

  function renderError(): void {
    const div = job?.status === "failed" ? divergence(job.error) : null;
    if (div) {
      // The run went non-finite or died: said at the top in red, in place of the error box below.
      const key = div.text;
      if (divergedEl.dataset.shown !== key) {
        divergedEl.dataset.shown = key;
        replace(
          divergedEl,
          h(
            "div",
            { class: "error-box diverged", id: "diverged", role: "alert" },
            h("strong", { class: "diverged-title" }, div.text),
            h(
              "p",
              null,
              div.dead
                ? "The run stopped learning there, so it was stopped and failed: no export is its result, and the checkpoints from before it are kept. A lower learning rate (optimizer.lr), a longer warm-up (schedule.warmup_steps) or gradient clipping (optimizer.max_grad_norm) usually keeps a run alive; health.on_dead: warn lets such a run go on with warnings."
                : "The run was stopped there and failed; no checkpoint or export is written after it. The charts draw the steps it recorded, the values that were not finite as gaps. A lower learning rate (optimizer.lr) or gradient clipping (optimizer.max_grad_norm) usually keeps a run finite.",
            ),
          ),
        );
      }
      replace(errorEl);
      return;
    }
    if (divergedEl.dataset.shown) {
      delete divergedEl.dataset.shown;
      replace(divergedEl);
    }
    if (!job?.error) {
      replace(errorEl);
      return;
    }
    const e = job.error;
    replace(
      errorEl,
      h(
        "div",
        { class: "error-box", role: "alert" },
        h("strong", null, "Error: "),
        e.message ?? "",
        e.errors?.length ? h("ul", null, e.errors.map((x) => h("li", null, `${String(x.loc)}: ${x.msg}`))) : null,
      ),
    );
  }

  function renderAll(): void {
    if (!job) return;
    renderHeader();
    renderSummary();
    renderStage();
    renderError();
    renderWarnings();
    for (const c of charts) c.setContext({ job });
    generate.update(job);
    // Redrawn only when it changed, so an opened "Raw JSON" stays open.
    const policy = JSON.stringify(job.policy ?? null);
    if (job.policy && Object.keys(job.policy).length && shownPolicy !== policy) {
      shownPolicy = policy;
      replace(policyEl, renderPlan(job.policy, { title: "Policy" }));
      annotate(policyEl);
    }
    const config = JSON.stringify(job.config, null, 2);
    if (configEl.textContent !== config) configEl.textContent = config;
  }

  async function loadCheckpoints(): Promise<void> {
    try {
      const { items } = await api.checkpoints(id);
      if (stopped) return;
      replace(
        ckptEl,
        items.length
          ? h(
              "table",
              { class: "data-table" },
              h("thead", null, h("tr", null, ["Name", "Step", "Size", "Path"].map((c) => h("th", { scope: "col" }, c)))),
              h("tbody", null, items.map((c) => h("tr", null, h("td", null, c.name), h("td", { class: "num" }, c.step ?? "–"), h("td", { class: "num" }, bytes(c.bytes)), h("td", null, h("code", null, c.path ?? ""))))),
            )
          : h("p", { class: "muted" }, "No checkpoints."),
      );
    } catch (err) {
      if (!stopped) replace(ckptEl, errorBox(err, "the checkpoints"));
    }
  }

  /** Everything the stream may have missed: metrics after the last contiguous step, and newer log lines. */
  async function catchUp(): Promise<void> {
    const [recs, lines] = await Promise.all([allMetrics(id, store.contiguousStep()), allLogs(id, logs.lastSeq)]);
    if (stopped) return;
    onMetrics(recs);
    addLogs(lines);
  }

  function setLive(state: StreamState | "final"): void {
    const text: Record<string, string> = {
      connecting: "connecting…",
      open: "live",
      reconnecting: "reconnecting…",
      ended: "",
      closed: "",
      final: "",
    };
    liveEl.textContent = text[state];
    liveEl.dataset.state = state;
  }

  function onStatus(ev: StatusEvent): void {
    if (!job || stopped) return;
    // A stream opened from the start replays a resumed job's earlier attempts; their end is not this one's.
    if (TERMINAL_STATUSES.has(ev.status) && !TERMINAL_STATUSES.has(job.status) && ev.ts && job.started_at && Date.parse(ev.ts) < Date.parse(job.started_at)) return;
    const at = ev.ts ? Date.parse(ev.ts) : NaN;
    if (ev.status === "queued" && Number.isFinite(at)) queuedAt = at;
    // The attempt starts with its "running" event: its clock too, before the next refresh brings started_at.
    if (ev.status === "running" && Number.isFinite(at) && (!job.started_at || at > Date.parse(job.started_at))) job.started_at = ev.ts ?? null;
    job.status = ev.status;
    if (ev.error) job.error = ev.error;
    renderHeader();
    renderError();
    renderStage();
    if (TERMINAL_STATUSES.has(ev.status)) {
      stream?.end();
      setLive("final");
    }
    void refreshJob(true);
  }

  /** A health warning as the stream sends it (after its step's metrics): marked now, not at the next refresh. */
  function onWarning(w: JobWarning): void {
    if (!job || !w || typeof w.step !== "number") return;
    const list = Array.isArray(job.warnings) ? job.warnings : [];
    if (list.some((x) => x.step === w.step && x.kind === w.kind)) return;
    job.warnings = [...list, w];
    renderWarnings();
    replace(badge, jobStatusBadge(job));
    for (const c of charts) c.setContext({ job });
  }

  /** A start-up stage as the stream sends it: where the attempt is now; "training" ends the start-up line. */
  function onStage(st: JobStage): void {
    if (!job || !st || typeof st.stage !== "string") return;
    job.stage = st;
    renderStage();
    if (st.stage === "training" || TERMINAL_STATUSES.has(job.status)) renderSummary();
  }

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
      onState: setLive,
      onReopen: () => void catchUp().catch(() => undefined),
    }, { events: ["metrics", "status", "log", "warning", "stage"], ...(apiToken() ? { sign: (url: string) => withTicket(url) } : {}) });
    // A stream reopened after a resume continues after the last event this page saw.
    stream.lastEventId = lastEventId;
    window.__slidedpStream = stream;
    stream.start();
  }

  async function refreshJob(withCatchUp: boolean): Promise<void> {
    if (timer) clearTimeout(timer);
    timer = null;
    try {
      const fresh = await api.job(id);
      if (stopped) return;
      const prev = job;
      job = { ...fresh, step: Math.max(fresh.step ?? 0, store.lastStep) };
      // Read before the stream's newest stage event of this attempt: that event stays.
      if (prev && prev.status === "running" && fresh.status === "running" && prev.started_at === fresh.started_at && stageAhead(prev.stage, fresh.stage)) job.stage = prev.stage;
      if (!job.last_metrics && store.length) job.last_metrics = store.records[store.length - 1];
      renderAll();
      const live = stream?.state === "open";
      if (withCatchUp || !live) await catchUp();
      if (stopped) return;
      if (TERMINAL_STATUSES.has(job.status)) {
        stream?.end();
        setLive("final");
        await loadCheckpoints();
        return;
      }
      if (!stream || stream.state === "ended" || stream.state === "closed") startStream();
    } catch (err) {
      if (stopped) return;
      if (err instanceof ApiError && err.status === 404) {
        replace(root, h("h1", null, `Job #${id}`), h("p", null, "There is no such job (it may have been deleted). ", h("a", { href: "/jobs" }, "All jobs")));
        stopped = true;
        return;
      }
      replace(errorEl, errorBox(err, "the job"));
    }
    if (!stopped) timer = setTimeout(() => void refreshJob(false), REFRESH_MS);
  }

  async function load(): Promise<void> {
    if (await apiAbsent()) {
      replace(summaryEl, h("p", { class: "muted" }, "This job appears once the API answers."));
      return;
    }
    try {
      job = await api.job(id);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        replace(root, h("h1", null, `Job #${id}`), h("p", null, "There is no such job. ", h("a", { href: "/jobs" }, "All jobs")));
      } else replace(errorEl, errorBox(err, "the job"));
      return;
    }
    if (stopped) return;
    renderAll();
    // Open the stream before reading the history so nothing falls between the two; the store merges by step.
    if (!TERMINAL_STATUSES.has(job.status)) startStream();
    else setLive("final");
    try {
      await catchUp();
    } catch (err) {
      if (!stopped) replace(errorEl, errorBox(err, "the metrics"));
    }
    await loadCheckpoints();
    if (!stopped) timer = setTimeout(() => void refreshJob(false), REFRESH_MS);
  }

  const clock = setInterval(() => {
    if (job && (job.status === "running" || job.status === "queued")) {
      renderClock();
      renderStageClock();
    }
  }, CLOCK_MS);

  void load();
  return () => {
    stopped = true;
    clearInterval(clock);
    lastEventId = stream?.lastEventId ?? null;
    stream?.close();
    if (window.__slidedpStream === stream) window.__slidedpStream = null;
    if (timer) clearTimeout(timer);
    for (const c of charts) c.destroy();
  };
}

async function allLogs(id: number, afterSeq: number): Promise<LogLine[]> {
  const out: LogLine[] = [];
  let cursor = afterSeq;
  // The server may page its answer; read until it has nothing newer (bounded, the tail is what is shown).
  for (let page = 0; page < 200; page++) {
    const { items } = await api.logs(id, cursor);
    if (!items || items.length === 0) break;
    out.push(...items);
    const last = items[items.length - 1].seq;
    if (!(last > cursor)) break;
    cursor = last;
    if (out.length > 20 * LOG_TAIL) out.splice(0, out.length - LOG_TAIL);
  }
  return out;
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

/** What the page says while a cancel is pending. */
function cancelNote(save: boolean, at: string | null | undefined): string {
  const t = at ? new Date(at) : null;
  const when = t && !Number.isNaN(t.getTime()) ? ` at ${t.toLocaleTimeString()}` : "";
  return `Cancel requested${when}: the job stops at the next step boundary${save ? " after writing a checkpoint" : ""}.`;
}
