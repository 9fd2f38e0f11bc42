// A job's start and end in words: where its start-up is (docs/interfaces.md §2 on_stage, §6 `stage`), how long
// the start took once it trains, and the reason a diverged run ended with. Pure functions, read by the job page.
import { duration, isNum, words } from "./fmt";
import { STAGE_TERMS } from "./glossary";
import type { Job, JobError, JobStage } from "./types";

/** What the page says while the job is in each stage. */
const HEADLINES: Readonly<Record<string, string>> = {
  queued: "Queued — waiting for the worker",
  launching: "Starting the job's process",
  preparing: "Preparing (loading the runtime)",
  planning: "Planning the execution policy",
  calibrating: "Calibrating this host (cached for the next runs)",
  building_host_state: "Building the host state",
  loading_weights: "Loading the model's weights into the host state",
  loading_checkpoint: "Loading the checkpoint into the host state",
  starting_ranks: "Starting the rank processes",
  first_step: "Running the first step",
  training: "Training",
};

/** Where a job that has no step of its current attempt yet is, or null once it trains (or it ended). A running
 *  job without a stage has been taken by the worker, whose process has not reported yet ("launching"), unless
 *  steps already came in (a server that does not report stages). */
export function startingStage(job: Pick<Job, "status" | "stage">, hasSteps: boolean): JobStage | null {
  if (job.status === "queued") return { stage: "queued" };
  if (job.status !== "running") return null;
  const s = job.stage;
  if (!s || typeof s.stage !== "string") return hasSteps ? null : { stage: "launching" };
  return s.stage === "training" ? null : s;
}

/** The order the stages of one attempt run in (the three ways of filling the host state are one step). */
const ORDER: Readonly<Record<string, number>> = {
  preparing: 0,
  planning: 1,
  calibrating: 2,
  building_host_state: 3,
  loading_weights: 3,
  loading_checkpoint: 3,
  starting_ranks: 4,
  first_step: 5,
  training: 6,
};

/** Whether `a` is a later report than `b` of the same attempt's start (a later stage, or later in the same one):
 *  a refresh that read the job before the stream's last event must not take the page back a stage. */
export function stageAhead(a: JobStage | null | undefined, b: JobStage | null | undefined): boolean {
  if (!a || typeof a.stage !== "string") return false;
  if (!b || typeof b.stage !== "string") return true;
  const ia = ORDER[a.stage];
  const ib = ORDER[b.stage];
  if (ia !== undefined && ib !== undefined && ia !== ib) return ia > ib;
  return isNum(a.elapsed_s) && isNum(b.elapsed_s) && a.elapsed_s > b.elapsed_s;
}

/** "Building the host state — 12 of 38 units"; a stage this page does not know yet in words of its own name. */
export function stageHeadline(s: JobStage): string {
  const base = HEADLINES[s.stage] ?? capitalise(words(s.stage));
  const units = isNum(s.done) && isNum(s.total) && s.total > 0 ? ` — ${Math.round(s.done)} of ${Math.round(s.total)} units` : "";
  return base + units;
}

/** Hover text of a stage (glossary.ts); "launching" is the moment before the process reports "preparing". */
export function stageHint(stage: string): string | undefined {
  if (stage === "launching") return "The worker took the job and is starting its process; the runtime reports its stages from there.";
  return STAGE_TERMS[stage]?.text;
}

/** The share of the stage done, 0..1, when it reports one. */
export function stageProgress(s: JobStage): number | null {
  if (isNum(s.progress)) return Math.min(1, Math.max(0, s.progress));
  if (isNum(s.done) && isNum(s.total) && s.total > 0) return Math.min(1, Math.max(0, s.done / s.total));
  return null;
}

export interface StartupPart {
  stage: string;
  label: string;
  seconds: number;
  hint?: string;
}

/** How long the start took, once the job trains: {total, parts} in the order the stages ran, or null. */
export function startupSummary(s: JobStage | null | undefined): { total: number; parts: StartupPart[] } | null {
  if (!s || s.stage !== "training" || !s.durations || typeof s.durations !== "object") return null;
  const parts: StartupPart[] = [];
  for (const [stage, sec] of Object.entries(s.durations)) {
    if (!isNum(sec)) continue;
    parts.push({ stage, label: STAGE_TERMS[stage]?.label ?? words(stage), seconds: sec, hint: STAGE_TERMS[stage]?.text });
  }
  const total = isNum(s.total_s) ? s.total_s : parts.reduce((a, p) => a + p.seconds, 0);
  return parts.length || isNum(s.total_s) ? { total, parts } : null;
}

/** "12.3 s", one decimal below two minutes (start-up figures are read to a tenth), then a duration. */
export function tenths(sec: number): string {
  return sec < 120 ? `${sec.toFixed(1)} s` : duration(sec);
}

/** "Start-up: 12.3 s (planning 0.4 s, host state 3.1 s, ranks 5.0 s, first step 3.8 s)" */
export function startupText(sum: { total: number; parts: StartupPart[] }): string {
  const parts = sum.parts.map((p) => `${p.label} ${tenths(p.seconds)}`).join(", ");
  return `Start-up: ${tenths(sum.total)}${parts ? ` (${parts})` : ""}`;
}

/** A run that diverged or died (error.message "diverged: loss is NaN at step 2", "diverged: the gradient norm is
 *  exactly 0 …, so nothing is learning, at step 4"): its step, its reason, and whether the numbers stayed finite
 *  (a dead run), else null. */
export function divergence(error: JobError | null | undefined): { step: number | null; reason: string; text: string; dead: boolean } | null {
  const msg = typeof error?.message === "string" ? error.message.trim() : "";
  if (!/^diverged:/i.test(msg)) return null;
  const rest = msg.replace(/^diverged:\s*/i, "").replace(/\.$/, "");
  const m = /^(.*?),?\s+at step (\d+)$/i.exec(rest);
  const reason = (m ? m[1] : rest) || "a number that is not finite";
  const step = m ? Number(m[2]) : null;
  const dead = !/\b(NaN|[+-]?inf)\b/.test(reason);
  return { step, reason, dead, text: step !== null ? `Diverged at step ${step}: ${reason}` : `Diverged: ${reason}` };
}

function capitalise(s: string): string {
  return s ? s[0].toUpperCase() + s.slice(1) : s;
}
