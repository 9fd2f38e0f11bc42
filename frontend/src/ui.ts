// Small widgets shared by the pages: status and warning badges, progress bar, error box, confirm-or-keep control.
import { ApiError, ApiUnreachable } from "./api";
import { h, replace } from "./dom";
import { num, words } from "./fmt";
import type { JobWarning } from "./types";

export function statusBadge(status: string): HTMLSpanElement {
  return h("span", { class: `badge status-${status}`, "data-status": status }, status);
}

/** A job's status badge: a job that completed with health warnings is never a plain green "completed". */
export function jobStatusBadge(job: { status: string; warnings?: JobWarning[] | null }): HTMLSpanElement {
  const n = Array.isArray(job.warnings) ? job.warnings.length : 0;
  if (job.status !== "completed" || n === 0) return statusBadge(job.status);
  return h(
    "span",
    { class: "badge status-completed-warned", "data-status": "completed", "data-warned": "true", title: `Completed, with ${n} health warning${n === 1 ? "" : "s"}:\n${warningLines(job.warnings ?? []).join("\n")}` },
    "completed with warnings",
  );
}

/** One line per warning, "step 3 · loss spike: ...", at most `max` of them and how many more. */
export function warningLines(list: readonly JobWarning[], max = 12): string[] {
  const lines = list.slice(0, max).map((w) => `step ${w.step} · ${words(String(w.kind ?? "warning"))}: ${w.message ?? ""}`);
  if (list.length > max) lines.push(`… and ${list.length - max} more`);
  return lines;
}

/** The count of a job's health warnings, its messages as hover text; null when it has none. */
export function warningBadge(list: readonly JobWarning[] | null | undefined): HTMLSpanElement | null {
  const n = Array.isArray(list) ? list.length : 0;
  if (!n) return null;
  return h(
    "span",
    { class: "badge warn-count", title: warningLines(list ?? []).join("\n"), "data-warnings": String(n) },
    "⚠ ",
    String(n),
    h("span", { class: "sr-only" }, n === 1 ? " warning" : " warnings"),
  );
}

export function progress(step: number, steps: number): HTMLElement {
  const frac = steps > 0 ? Math.min(1, Math.max(0, step / steps)) : 0;
  return h(
    "div",
    { class: "progress", title: `${step} of ${steps} steps` },
    h("progress", { max: steps > 0 ? steps : 1, value: steps > 0 ? Math.min(step, steps) : 0, "aria-label": "steps done" }),
    h("span", { class: "progress-label" }, `${step} / ${steps}`, steps > 0 ? ` (${num(frac * 100, 3)} %)` : ""),
  );
}

/** An error as a visible box; the API being away is said differently from a refused request. */
export function errorBox(err: unknown, what: string): HTMLElement {
  if (err instanceof ApiUnreachable) {
    return h("div", { class: "error-box", role: "alert" }, h("strong", null, `Cannot load ${what}: `), "the API is unreachable.");
  }
  const msg = err instanceof ApiError ? `${err.message} (HTTP ${err.status})` : String((err as Error)?.message ?? err);
  return h("div", { class: "error-box", role: "alert" }, h("strong", null, `Cannot load ${what}: `), msg);
}

export interface ConfirmOptions {
  /** The first button: "Cancel job". */
  label: string;
  /** The button that does it: "Confirm cancel". */
  confirmLabel: string;
  /** The button that backs out: "Keep running". */
  keepLabel: string;
  /** Said beside the two buttons: "Stop this job?" */
  question?: string;
  /** Class of the first button ("danger", "secondary"). */
  cls?: string;
  /** The action; returning false (it failed and said why) brings the first button back. */
  action: () => Promise<boolean | void> | boolean | void;
  /** Shown, disabled, once the action is done, until the page replaces the control (the job's final status). */
  doneLabel?: string;
}

/**
 * A destructive action asked twice, without a modal dialog and without a timer: the first button turns into an
 * explicit choice ("Confirm cancel" / "Keep running") that stays until one of the two is pressed. Its state is in
 * data-state: idle, asking, working, done.
 */
export function confirmControl(opts: ConfirmOptions): HTMLElement {
  const box = h("span", { class: "confirm", dataset: { state: "idle" } });
  const first = h("button", { type: "button", class: opts.cls ?? "danger" }, opts.label);
  const confirm = h("button", { type: "button", class: "armed" }, opts.confirmLabel);
  const keep = h("button", { type: "button", class: "secondary" }, opts.keepLabel);
  const question = opts.question ? h("span", { class: "confirm-question" }, opts.question) : null;
  const show = (state: "idle" | "asking" | "working" | "done") => {
    box.dataset.state = state;
    if (state === "idle") replace(box, first);
    else if (state === "asking") replace(box, question, confirm, keep);
    else if (state === "working") {
      confirm.disabled = true;
      keep.disabled = true;
    } else replace(box, h("button", { type: "button", class: "secondary", disabled: true }, opts.doneLabel ?? opts.confirmLabel));
  };
  first.addEventListener("click", () => {
    show("asking");
    // The safe choice has the focus: Enter right after the first press does not destroy anything.
    keep.focus();
  });
  keep.addEventListener("click", () => {
    show("idle");
    first.focus();
  });
  confirm.addEventListener("click", async () => {
    show("working");
    let ok: boolean | void = false;
    try {
      ok = await opts.action();
    } finally {
      confirm.disabled = false;
      keep.disabled = false;
      if (ok === false || !opts.doneLabel) show("idle");
      else show("done");
    }
  });
  show("idle");
  return box;
}

/** confirmControl for the simple case: press, then confirm or keep. */
export function confirmButton(label: string, confirmLabel: string, action: () => Promise<boolean | void> | boolean | void, cls = "danger", keepLabel = "Keep"): HTMLElement {
  return confirmControl({ label, confirmLabel, keepLabel, action, cls });
}

/** Run an action from a button, showing its failure next to it instead of in the console. */
export async function runAction(btn: HTMLButtonElement, out: HTMLElement, fn: () => Promise<unknown>): Promise<boolean> {
  btn.disabled = true;
  out.textContent = "";
  try {
    await fn();
    return true;
  } catch (err) {
    out.className = "action-error";
    out.textContent = err instanceof ApiError ? err.message : String((err as Error).message ?? err);
    return false;
  } finally {
    btn.disabled = false;
  }
}
