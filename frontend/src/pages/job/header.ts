// The job page's head: its title, status badge and stream state, and the actions the job's status allows (cancel,
// with a checkpoint or not; resume; download the export; delete), with what became of the last one asked for.
import { api, apiToken, download } from "../../api";
import { h, replace } from "../../dom";
import { navigate } from "../../router";
import type { StreamState } from "../../sse";
import { TERMINAL_STATUSES, type Job } from "../../types";
import { confirmControl, jobStatusBadge, runAction } from "../../ui";

/** What the actions need of the page: its job, the newest step it has seen, redrawing and following it, and
 *  holding its reads of the job while deleting it. */
export interface JobPageHooks {
  job(): Job | null;
  setJob(job: Job): void;
  lastStep(): number;
  renderAll(): void;
  startStream(): void;
  /** No read of the job from now on; resolves once none is on its way. */
  holdReads(): Promise<void>;
  resumeReads(): void;
}

export interface JobHeader {
  readonly el: HTMLElement;
  /** Title, badge and the actions for the job's status; the actions are rebuilt only when that changed. */
  render(job: Job): void;
  /** The status badge alone (a warning arrived). */
  renderBadge(job: Job): void;
  /** The stream's state beside the title: "live", "reconnecting…", or nothing once the job has ended. */
  setLive(state: StreamState | "final"): void;
}

const LIVE_TEXT: Record<StreamState | "final", string> = {
  connecting: "connecting…",
  open: "live",
  reconnecting: "reconnecting…",
  ended: "",
  closed: "",
  final: "",
};

export function jobHeader(id: number, page: JobPageHooks): JobHeader {
  const title = h("h1", null, `Job #${id}`);
  const badge = h("span");
  const liveEl = h("span", { class: "live", id: "stream-state", role: "status" });
  const actionsEl = h("div", { class: "actions" });
  const out = h("span", { class: "action-note", role: "status" });
  const el = h("div", { class: "page-head" }, h("div", { class: "title-row" }, title, badge, liveEl), h("div", { class: "toolbar" }, actionsEl, out));
  // A cancel this page asked for, or the job's pending one: its note stays until the final status replaces it.
  let cancelAsked: { save: boolean } | null = null;

  function cancelControls(): HTMLElement[] {
    const save = h("input", { type: "checkbox", id: "cancel-save" });
    const saveLabel = h("label", { class: "check", for: "cancel-save" }, save, " save a checkpoint");
    return [
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
          const before = page.job();
          if (before && !TERMINAL_STATUSES.has(before.status)) page.setJob({ ...fresh, step: Math.max(fresh.step ?? 0, page.lastStep()) });
          save.disabled = true;
          const job = page.job();
          if (job?.status === "running") {
            out.className = "action-note";
            out.textContent = cancelNote(withSave, job.cancel_requested_at);
          }
          page.renderAll();
          return true;
        },
      }),
    ];
  }

  function resumeButton(): HTMLElement {
    const btn = h("button", { type: "button", class: "secondary" }, "Resume");
    btn.addEventListener("click", async () => {
      await runAction(btn, out, async () => {
        page.setJob(await api.resume(id));
        page.renderAll();
        page.startStream();
      });
    });
    return btn;
  }

  function exportLink(): HTMLElement {
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
    return link;
  }

  function deleteButton(): HTMLElement {
    // The page stops reading the job before the delete is sent: a read after it would answer 404. Once done the
    // control stays "Deleted", so no second delete can be sent before the page is left.
    return confirmControl({
      label: "Delete",
      confirmLabel: "Confirm delete",
      keepLabel: "Keep",
      doneLabel: "Deleted",
      action: async () => {
        await page.holdReads();
        try {
          await api.remove(id);
        } catch (err) {
          page.resumeReads();
          out.className = "action-error";
          out.textContent = (err as Error).message;
          return false;
        }
        navigate("/jobs");
        return true;
      },
    });
  }

  function render(job: Job): void {
    title.textContent = `Job #${job.id}${job.name ? ` · ${job.name}` : ""}`;
    replace(badge, jobStatusBadge(job));
    // Rebuilt only when the status or a pending cancel changes: a half-confirmed cancel, a ticked box or the focus
    // survive refreshes.
    const key = `${job.status}|${job.status === "running" ? (job.cancel_request ?? "") : ""}`;
    if (actionsEl.dataset.state === key) return;
    actionsEl.dataset.state = key;
    actionsEl.dataset.status = job.status;
    replace(actionsEl);
    if (job.status === "running" && job.cancel_request) {
      // Asked for here or elsewhere, before a reload too: said until the job's final status replaces it.
      const save = job.cancel_request === "save";
      cancelAsked = { save };
      actionsEl.append(h("button", { type: "button", class: "secondary", disabled: true }, "Cancel requested…"));
      out.className = "action-note";
      delete out.dataset.outcome;
      out.textContent = cancelNote(save, job.cancel_requested_at);
    } else if (job.status === "queued" || job.status === "running") {
      actionsEl.append(...cancelControls());
    } else if (cancelAsked) {
      // The job ended: its final status replaces "Cancel requested…".
      const step = Math.max(job.step ?? 0, page.lastStep());
      out.className = "action-note";
      out.dataset.outcome = job.status;
      out.textContent =
        job.status === "cancelled"
          ? `Cancelled at step ${step}.${cancelAsked.save ? " A checkpoint was asked for: the checkpoints are listed below." : ""}`
          : `The job ended as ${job.status} at step ${step} before the cancel took effect.`;
      cancelAsked = null;
    }
    if (job.status === "failed" || job.status === "cancelled" || job.status === "interrupted") actionsEl.append(resumeButton());
    if (job.status === "completed" && job.config?.export !== false) actionsEl.append(exportLink());
    if (TERMINAL_STATUSES.has(job.status)) actionsEl.append(deleteButton());
  }

  function setLive(state: StreamState | "final"): void {
    liveEl.textContent = LIVE_TEXT[state];
    liveEl.dataset.state = state;
  }

  return { el, render, renderBadge: (job) => replace(badge, jobStatusBadge(job)), setLive };
}

/** What the page says while a cancel is pending. */
function cancelNote(save: boolean, at: string | null | undefined): string {
  const t = at ? new Date(at) : null;
  const when = t && !Number.isNaN(t.getTime()) ? ` at ${t.toLocaleTimeString()}` : "";
  return `Cancel requested${when}: the job stops at the next step boundary${save ? " after writing a checkpoint" : ""}.`;
}
