// Jobs list: status (with its health warnings), progress, final loss and eval loss, median throughput, how long it ran
// and ETA of every job, with cancel, resume and delete; ticked jobs open side by side on the compare page.
import { api } from "../api";
import { h, replace } from "../dom";
import { duration, grouped, num, rate, when } from "../fmt";
import { apiAbsent } from "../health";
import { compareHref, MAX_COMPARED, parseSelection } from "../overlay";
import { navigate, type Cleanup } from "../router";
import { TERMINAL_STATUSES, type Job } from "../types";
import { confirmButton, confirmControl, errorBox, jobStatusBadge, progress, runAction, warningBadge } from "../ui";

const PAGE = 50;
const POLL_MS = 2000;
const STATUSES = ["", "queued", "running", "completed", "failed", "cancelled", "interrupted"];
/** The columns after the tick box, with what each says (docs/interfaces.md §6, `summary`). */
const COLUMNS: [string, string | null][] = [
  ["Job", null],
  ["Status", null],
  ["Progress", null],
  ["Final loss", "Training loss of the newest step, in nats per target token."],
  ["Eval loss", "Loss on the evaluation data at the newest step that evaluated, in nats per target token."],
  ["Tokens/s", "Median tokens per second of the job's steps, the first (warm-up) step left out."],
  ["Duration", "How long the job has run: from start to end, its attempts summed when it was resumed; growing while it runs."],
  ["ETA", null],
  ["Host", null],
  ["Created", null],
  ["Actions", null],
];

export function jobsPage(root: HTMLElement): Cleanup {
  let offset = 0;
  let status = "";
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | null = null;
  const rows = new Map<number, HTMLTableRowElement>();
  // Jobs deleted from this page: a list read before the delete landed still names them, and must not bring their
  // row back (with a Delete button whose press would ask the server to delete the job again, answered 404).
  const deleted = new Set<number>();
  // Ticked jobs, in the order they were ticked; kept across pages and filters. The compare page's "Change
  // selection" comes back with them (`?select=3,5`).
  const selected = new Set<number>(parseSelection(new URLSearchParams({ ids: new URLSearchParams(location.search).get("select") ?? "" }).toString()).ids);

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
      h(
        "tr",
        null,
        h("th", { scope: "col" }, h("span", { class: "sr-only" }, "Compare")),
        COLUMNS.map(([c, hint]) => h("th", { scope: "col", title: hint }, c)),
      ),
    ),
    tbody,
  );
  const empty = h("p", { class: "muted", hidden: true }, "No jobs yet. ", h("a", { href: "/jobs/new" }, "Submit one"), ".");
  const message = h("div", { class: "page-message" });
  const prev = h("button", { type: "button", disabled: true }, "Previous");
  const next = h("button", { type: "button", disabled: true }, "Next");
  const count = h("span", { class: "muted" });
  const compare = h("button", { type: "button", id: "compare-jobs", disabled: true }, "Compare");
  const picked = h("span", { class: "muted", id: "compare-count" });

  replace(
    root,
    h(
      "div",
      { class: "page-head" },
      h("h1", null, "Jobs"),
      h("div", { class: "toolbar" }, picked, compare, h("label", { for: "status-filter" }, "Status "), filter, h("a", { class: "button primary", href: "/jobs/new" }, "New job")),
    ),
    message,
    h("div", { class: "table-wrap" }, table),
    empty,
    h("div", { class: "pager" }, prev, count, next),
  );

  compare.addEventListener("click", () => navigate(compareHref([...selected])));
  showSelection();

  function showSelection(): void {
    const n = selected.size;
    compare.disabled = n < 2 || n > MAX_COMPARED;
    compare.title = n < 2 ? "Tick two or more jobs to compare their loss curves." : n > MAX_COMPARED ? `At most ${MAX_COMPARED} jobs are compared at once.` : `Overlay the loss curves of jobs ${[...selected].map((id) => `#${id}`).join(", ")}.`;
    picked.textContent = n ? `${n} selected` : "";
  }

  /** The row's tick box, made once so that polling never undoes a tick. */
  function tickBox(job: Job): HTMLInputElement {
    const box = h("input", { type: "checkbox", class: "pick", "aria-label": `Compare job #${job.id}`, checked: selected.has(job.id) });
    box.addEventListener("change", () => {
      if (box.checked) selected.add(job.id);
      else selected.delete(job.id);
      showSelection();
    });
    return box;
  }

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
            deleted.add(job.id);
            rows.get(job.id)?.remove();
            rows.delete(job.id);
            selected.delete(job.id);
            showSelection();
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
    if (!cells[0].firstChild) cells[0].append(tickBox(job));
    replace(cells[1], h("a", { href: `/jobs/${job.id}` }, `#${job.id}`), job.name ? ` ${job.name}` : "");
    const warnings = Array.isArray(job.warnings) ? job.warnings : [];
    // Rebuilt only when what they show changed, so a half-confirmed cancel survives the polling.
    const key = JSON.stringify([job.status, job.cancel_request ?? null]);
    if (row.dataset.state !== key) {
      replace(cells[11], actions(job));
      row.dataset.state = key;
    }
    const badges = JSON.stringify([job.status, warnings]);
    if (row.dataset.badges !== badges) {
      replace(cells[2], h("span", { class: "status-cell" }, jobStatusBadge(job), warningBadge(warnings)));
      row.dataset.badges = badges;
    }
    row.dataset.status = job.status;
    replace(cells[3], progress(job.step ?? 0, job.steps ?? 0));
    const s = job.summary;
    setFigure(cells[4], "final-loss", s ? num(s.final_loss, 4) : "–");
    const evaluated = typeof s?.final_eval_loss === "number";
    setFigure(cells[5], "eval-loss", evaluated ? num(s?.final_eval_loss, 4) : "–", evaluated ? `At step ${s?.final_eval_step}.` : "The job has not evaluated (config eval).");
    // An older server has no summary: its newest step's rate then.
    const tps = s ? s.median_tokens_per_s : (job.tokens_per_s ?? job.last_metrics?.tokens_per_s);
    setFigure(cells[6], "tokens-per-s", typeof tps === "number" ? `${grouped(tps)} tokens/s` : rate(tps, ""));
    setFigure(cells[7], "duration", duration(s?.duration_s));
    cells[8].textContent = job.status === "running" ? duration(job.eta_s) : "–";
    cells[9].textContent = job.host ?? "–";
    cells[10].textContent = when(job.created_at);
  }

  function setFigure(cell: HTMLTableCellElement, name: string, text: string, hint?: string): void {
    cell.className = "num";
    cell.dataset.col = name;
    cell.textContent = text;
    if (hint) cell.title = hint;
    else cell.removeAttribute("title");
  }

  async function refresh(): Promise<void> {
    if (timer) clearTimeout(timer);
    timer = null;
    if (await apiAbsent()) {
      replace(message, h("p", { class: "muted" }, "The jobs appear here once the API answers."));
      return;
    }
    try {
      const listed = await api.listJobs({ status: status || undefined, limit: PAGE, offset });
      if (stopped) return;
      const items = listed.items.filter((job) => !deleted.has(job.id));
      const total = listed.total - (listed.items.length - items.length);
      replace(message);
      const keep = new Set<number>();
      items.forEach((job, i) => {
        keep.add(job.id);
        let row = rows.get(job.id);
        if (!row) {
          row = h("tr", { dataset: { jobId: String(job.id) } }, Array.from({ length: COLUMNS.length + 1 }, () => h("td")));
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
