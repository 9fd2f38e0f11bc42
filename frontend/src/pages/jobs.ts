// Jobs list: status (with its health warnings), progress, ETA and throughput of every job, with cancel, resume and
// delete.
import { api } from "../api";
import { h, replace } from "../dom";
import { duration, rate, when } from "../fmt";
import { apiAbsent } from "../health";
import type { Cleanup } from "../router";
import { TERMINAL_STATUSES, type Job } from "../types";
import { confirmButton, confirmControl, errorBox, jobStatusBadge, progress, runAction, warningBadge } from "../ui";

const PAGE = 50;
const POLL_MS = 2000;
const STATUSES = ["", "queued", "running", "completed", "failed", "cancelled", "interrupted"];

export function jobsPage(root: HTMLElement): Cleanup {
  let offset = 0;
  let status = "";
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | null = null;
  const rows = new Map<number, HTMLTableRowElement>();

  const filter = h(
    "select",
    { id: "status-filter" },
    STATUSES.map((s) => h("option", { value: s }, s || "all")),
  );
  const tbody = h("tbody");
  const table = h(
    "table",
    { class: "jobs-table" },
    h("caption", { class: "sr-only" }, "Jobs"),
    h(
      "thead",
      null,
      h("tr", null, ["Job", "Status", "Progress", "ETA", "Tokens/s", "Host", "Created", "Actions"].map((c) => h("th", { scope: "col" }, c))),
    ),
    tbody,
  );
  const empty = h("p", { class: "muted", hidden: true }, "No jobs yet. ", h("a", { href: "/jobs/new" }, "Submit one"), ".");
  const message = h("div", { class: "page-message" });
  const prev = h("button", { type: "button", disabled: true }, "Previous");
  const next = h("button", { type: "button", disabled: true }, "Next");
  const count = h("span", { class: "muted" });

  replace(
    root,
    h(
      "div",
      { class: "page-head" },
      h("h1", null, "Jobs"),
      h("div", { class: "toolbar" }, h("label", { for: "status-filter" }, "Status "), filter, h("a", { class: "button primary", href: "/jobs/new" }, "New job")),
    ),
    message,
    h("div", { class: "table-wrap" }, table),
    empty,
    h("div", { class: "pager" }, prev, count, next),
  );

  filter.addEventListener("change", () => {
    status = filter.value;
    offset = 0;
    void refresh();
  });
  prev.addEventListener("click", () => {
    offset = Math.max(0, offset - PAGE);
    void refresh();
  });
  next.addEventListener("click", () => {
    offset += PAGE;
    void refresh();
  });

  function actions(job: Job): HTMLElement {
    const out = h("span", { class: "action-error", role: "status" });
    const cell = h("div", { class: "actions" });
    if (job.status === "running" && job.cancel_request) {
      // Asked already (here, on the job page or by another client): said until the job ends.
      cell.append(
        h(
          "button",
          { type: "button", class: "secondary", disabled: true, title: job.cancel_request === "save" ? "The job writes a checkpoint, then stops." : "The job stops at the next step boundary." },
          "Cancel requested…",
        ),
      );
    } else if (job.status === "queued" || job.status === "running") {
      cell.append(
        confirmControl({
          label: "Cancel",
          confirmLabel: "Confirm cancel",
          keepLabel: "Keep running",
          cls: "secondary",
          doneLabel: "Cancel requested…",
          action: async () => {
            try {
              await api.cancel(job.id, false);
              return true;
            } catch (err) {
              out.textContent = (err as Error).message;
              return false;
            } finally {
              void refresh();
            }
          },
        }),
      );
    }
    if (job.status === "failed" || job.status === "cancelled" || job.status === "interrupted") {
      const btn = h("button", { type: "button", class: "secondary" }, "Resume");
      btn.addEventListener("click", async () => {
        if (await runAction(btn, out, () => api.resume(job.id))) void refresh();
      });
      cell.append(btn);
    }
    if (TERMINAL_STATUSES.has(job.status)) {
      cell.append(
        confirmButton("Delete", "Confirm delete", async () => {
          try {
            await api.remove(job.id);
            rows.get(job.id)?.remove();
            rows.delete(job.id);
          } catch (err) {
            out.textContent = (err as Error).message;
            return false;
          }
        }),
      );
    }
    cell.append(out);
    return cell;
  }

  function fill(row: HTMLTableRowElement, job: Job): void {
    const cells = row.cells;
    replace(cells[0], h("a", { href: `/jobs/${job.id}` }, `#${job.id}`), job.name ? ` ${job.name}` : "");
    const warnings = Array.isArray(job.warnings) ? job.warnings : [];
    // Rebuilt only when what they show changed, so a half-confirmed cancel survives the polling.
    const key = JSON.stringify([job.status, job.cancel_request ?? null]);
    if (row.dataset.state !== key) {
      replace(cells[7], actions(job));
      row.dataset.state = key;
    }
    const badges = JSON.stringify([job.status, warnings]);
    if (row.dataset.badges !== badges) {
      replace(cells[1], h("span", { class: "status-cell" }, jobStatusBadge(job), warningBadge(warnings)));
      row.dataset.badges = badges;
    }
    row.dataset.status = job.status;
    replace(cells[2], progress(job.step ?? 0, job.steps ?? 0));
    cells[3].textContent = job.status === "running" ? duration(job.eta_s) : "–";
    cells[4].textContent = rate(job.tokens_per_s ?? job.last_metrics?.tokens_per_s, "");
    cells[5].textContent = job.host ?? "–";
    cells[6].textContent = when(job.created_at);
  }

  async function refresh(): Promise<void> {
    if (timer) clearTimeout(timer);
    timer = null;
    if (await apiAbsent()) {
      replace(message, h("p", { class: "muted" }, "The jobs appear here once the API answers."));
      return;
    }
    try {
      const { items, total } = await api.listJobs({ status: status || undefined, limit: PAGE, offset });
      if (stopped) return;
      replace(message);
      const keep = new Set<number>();
      items.forEach((job, i) => {
        keep.add(job.id);
        let row = rows.get(job.id);
        if (!row) {
          row = h("tr", { dataset: { jobId: String(job.id) } }, Array.from({ length: 8 }, () => h("td")));
          rows.set(job.id, row);
        }
        if (tbody.children[i] !== row) tbody.insertBefore(row, tbody.children[i] ?? null);
        fill(row, job);
      });
      for (const [id, row] of rows) {
        if (!keep.has(id)) {
          row.remove();
          rows.delete(id);
        }
      }
      empty.hidden = items.length > 0 || offset > 0;
      prev.disabled = offset === 0;
      next.disabled = offset + items.length >= total;
      count.textContent = total > 0 ? `${offset + 1}–${offset + items.length} of ${total}` : "";
    } catch (err) {
      if (stopped) return;
      replace(message, errorBox(err, "the jobs"));
    }
    if (!stopped && !document.hidden) timer = setTimeout(() => void refresh(), POLL_MS);
    else if (!stopped) timer = setTimeout(() => void refresh(), POLL_MS * 5);
  }

  void refresh();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}
