// The job page's problems: a diverged or dead run's reason at the top in red, the job's error, and the health
// warnings its steps raised.
import { jobWarnings } from "../../charts";
import { h, replace } from "../../dom";
import { words } from "../../fmt";
import { CHART_TERMS } from "../../glossary";
import { divergence } from "../../stage";
import type { Job } from "../../types";

export interface ProblemsPanel {
  /** Where a diverged run's reason goes, above the summary. */
  readonly divergedEl: HTMLElement;
  /** The job's error, or what the page could not read. */
  readonly errorEl: HTMLElement;
  readonly warningsEl: HTMLElement;
  renderError(job: Job | null): void;
  /** Redrawn only when the list changed. */
  renderWarnings(job: Job | null): void;
  /** Say something in the error slot (the page could not read the job or its metrics). */
  showError(box: HTMLElement): void;
}

export function problemsPanel(): ProblemsPanel {
  const divergedEl = h("div", { class: "diverged-slot" });
  const errorEl = h("div");
  const warningsEl = h("section", { class: "warnings", "aria-label": "Warnings", hidden: true });
  let shownWarnings = "";

  function renderWarnings(job: Job | null): void {
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

  function renderError(job: Job | null): void {
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

  return { divergedEl, errorEl, warningsEl, renderError, renderWarnings, showError: (box) => replace(errorEl, box) };
}
