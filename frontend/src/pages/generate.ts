// The job page's prompt box: try the trained model (the job's export, or one of its checkpoints) on a prompt. The
// answer is computed on the job's host through the job's queue (POST /api/jobs/{id}/generate, docs/interfaces.md §6),
// so the box says what the prompt waits for ("queued behind job N") until the answer comes.
import { ApiError, request } from "../api";
import { h, replace } from "../dom";
import type { Job } from "../types";

const POLL_MS = 1000;

/** A generation as GET /api/jobs/{id}/generations/{gid} answers it. */
export interface Generation {
  id: number;
  job_id: number;
  status: "queued" | "running" | "done" | "failed" | string;
  url: string;
  prompt: string;
  max_new_tokens: number;
  temperature: number;
  checkpoint: string | null;
  host: string | null;
  waiting?: string | null;
  waiting_for_job?: number | null;
  formatted_prompt?: string | null;
  text?: string | null;
  format?: string | null;
  new_tokens?: number | null;
  stop?: "eos" | "length" | string | null;
  /** Why an answer is empty or cut short, and what to try (the runtime's words). */
  note?: string | null;
  error?: string | null;
  timings?: Record<string, number | null> | null;
}

/** What the model can be loaded from: the export of a completed job, and its checkpoints by name. */
export function modelSources(job: Pick<Job, "status" | "config" | "checkpoints">): { value: string; label: string }[] {
  const out: { value: string; label: string }[] = [];
  if (job.status === "completed" && job.config?.export !== false) out.push({ value: "", label: "Export (final)" });
  for (const name of job.checkpoints ?? []) out.push({ value: name, label: `Checkpoint ${name}` });
  return out;
}

/** One line saying where a generation is: what it waits for, that it runs, or how the answer came. */
export function statusLine(g: Generation): string {
  const t = g.timings ?? {};
  if (g.status === "queued") {
    if (typeof g.waiting_for_job === "number") return `Queued behind job ${g.waiting_for_job}${hostOf(g.waiting)}: it runs when that job leaves the host.`;
    return g.waiting ? `Queued: ${g.waiting}.` : "Queued.";
  }
  if (g.status === "running") return `Generating on ${g.host ?? "the job's host"}…`;
  if (g.status === "failed") return `Failed: ${g.error ?? "no reason given"}`;
  const parts = [`${g.new_tokens ?? 0} tokens`];
  if (typeof t.generate_s === "number") parts.push(`${t.generate_s.toFixed(2)} s`);
  if (typeof t.convert_s === "number") parts.push(`checkpoint converted in ${t.convert_s.toFixed(1)} s`);
  if (typeof t.load_s === "number") parts.push(`model loaded in ${t.load_s.toFixed(1)} s`);
  if (typeof t.queued_s === "number" && t.queued_s >= 1) parts.push(`queued ${t.queued_s.toFixed(0)} s`);
  const why = g.stop === "length" ? "; it stopped at max new tokens" : "";
  return `Answered on ${g.host ?? "the job's host"} (${parts.join(", ")})${why}.`;
}

/** What to say under a finished answer: the runtime's note, or, from a server without notes, that it is empty. */
export function answerNote(g: Generation): string | null {
  if (g.status !== "done") return null;
  if (g.note) return g.note;
  return (g.text ?? "").trim() ? null : "The answer is empty: the model generated nothing printable.";
}

function hostOf(waiting: string | null | undefined): string {
  const m = /on host (\S+)/.exec(waiting ?? "");
  return m ? ` on host ${m[1]}` : "";
}

/** The prompt box of job `jobId`; `update(job)` shows it once the job has a model to load, hides it otherwise. */
export function generatePanel(jobId: number): { el: HTMLElement; update: (job: Job) => void } {
  const prompt = h("textarea", { id: "gen-prompt", rows: 3, required: true, placeholder: "3 + 5 =" });
  const maxNew = h("input", { id: "gen-max", type: "number", min: 1, max: 1024, step: 1, value: "32" });
  const temp = h("input", { id: "gen-temp", type: "number", min: 0, max: 5, step: 0.1, value: "0" });
  const source = h("select", { id: "gen-source" });
  const submit = h("button", { type: "submit", class: "primary" }, "Generate");
  const problems = h("div", { class: "gen-problems", role: "alert" });
  const statusEl = h("p", { id: "gen-status", role: "status", class: "muted" });
  const formattedEl = h("pre", { id: "gen-formatted" });
  const formattedBox = h("details", { hidden: true }, h("summary", null, "The prompt as the model read it"), formattedEl);
  const answerEl = h("pre", { id: "gen-answer", "aria-label": "Answer", hidden: true });
  const noteEl = h("p", { id: "gen-note", class: "warn-box", hidden: true });
  const field = (id: string, label: string, input: HTMLElement, hint?: string) =>
    h("div", { class: "field" }, h("label", { for: id, title: hint }, label), input);
  const form = h(
    "form",
    { class: "gen-form" },
    field("gen-prompt", "Prompt", prompt, "Formatted as the job formatted its training examples (its data.format)"),
    h(
      "div",
      { class: "field-grid" },
      field("gen-max", "Max new tokens", maxNew),
      field("gen-temp", "Temperature", temp, "0: greedy (the most likely token each time); above 0: sampled"),
      field("gen-source", "Model", source),
    ),
    h("div", { class: "actions" }, submit),
    problems,
  );
  const el = h(
    "section",
    { class: "card", id: "generate", "aria-labelledby": "gen-h", hidden: true },
    h("h2", { id: "gen-h" }, "Try the model"),
    h("p", { class: "muted" }, "The answer is computed on the job's host, after any job that runs there."),
    form,
    statusEl,
    formattedBox,
    answerEl,
    noteEl,
  );
  let shownSources = "";
  let timer: ReturnType<typeof setTimeout> | null = null;

  function show(g: Generation): void {
    statusEl.textContent = statusLine(g);
    statusEl.dataset.status = g.status;
    statusEl.dataset.generation = String(g.id);
    statusEl.className = g.status === "failed" ? "action-error" : "muted";
    formattedBox.hidden = g.formatted_prompt == null;
    formattedEl.textContent = g.formatted_prompt ?? "";
    answerEl.hidden = g.status !== "done";
    answerEl.textContent = g.text ?? "";
    const note = answerNote(g);
    noteEl.hidden = note === null;
    noteEl.textContent = note ?? "";
  }

  async function follow(url: string): Promise<void> {
    if (!el.isConnected) return; // the page was left: stop polling
    let g: Generation;
    try {
      g = await request<Generation>("GET", url);
    } catch (err) {
      statusEl.className = "action-error";
      statusEl.textContent = `The answer could not be read: ${(err as Error).message}`;
      submit.disabled = false;
      return;
    }
    show(g);
    if (g.status === "done" || g.status === "failed") submit.disabled = false;
    else timer = setTimeout(() => void follow(url), POLL_MS);
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (timer) clearTimeout(timer);
    replace(problems);
    submit.disabled = true;
    const body = { prompt: prompt.value, max_new_tokens: Number(maxNew.value), temperature: Number(temp.value), checkpoint: source.value || null };
    try {
      const g = await request<Generation>("POST", `/api/jobs/${jobId}/generate`, body);
      show(g);
      timer = setTimeout(() => void follow(g.url), POLL_MS);
    } catch (err) {
      submit.disabled = false;
      const fields = err instanceof ApiError ? err.fieldErrors : [];
      replace(
        problems,
        h(
          "div",
          { class: "error-box" },
          fields.length ? h("ul", null, fields.map((f) => h("li", null, f.loc ? `${f.loc}: ${f.msg}` : f.msg))) : (err as Error).message,
        ),
      );
    }
  });

  function update(job: Job): void {
    const sources = modelSources(job);
    el.hidden = sources.length === 0;
    const key = JSON.stringify(sources);
    if (key === shownSources) return;
    shownSources = key;
    const chosen = source.value;
    replace(source, sources.map((s) => h("option", { value: s.value, selected: s.value === chosen }, s.label)));
  }

  return { el, update };
}
