// Shapes of the REST/SSE contract (docs/interfaces.md §3 and §6). Every field the UI reads may be absent:
// records come from several runtime versions and hosts, and the UI shows what exists instead of guessing.

export type JobStatus = "queued" | "running" | "completed" | "failed" | "cancelled" | "interrupted";
export const TERMINAL_STATUSES: ReadonlySet<string> = new Set(["completed", "failed", "cancelled", "interrupted"]);

/** One optimizer step (docs/interfaces.md §3). */
export interface MetricsRecord {
  step: number;
  loss?: number | null;
  lr?: number | null;
  grad_norm?: number | null;
  clipped?: boolean | null;
  step_time_s?: number | null;
  tokens_per_s?: number | null;
  tflops?: number | null;
  mfu?: number | null;
  hbm_peak_gib?: (number | null)[] | null;
  host_rss_gib?: number | null;
  data_time_s?: number | null;
  phases?: Record<string, number | null> | null;
  predicted?: Record<string, number | null> | null;
  bytes?: Record<string, number[] | null> | null;
  tokens?: number | null;
  target_tokens?: number | null;
  [key: string]: unknown;
}

export interface FieldErrorItem {
  loc: string; // config key path, e.g. "optimizer.lr" or "optimizer.betas[0]"
  msg: string;
}

export interface JobError {
  message?: string;
  errors?: { loc: unknown; msg: string }[];
}

export interface Job {
  id: number;
  name: string | null;
  status: JobStatus | string;
  config: Record<string, unknown>;
  host: string | null;
  policy: Record<string, unknown> | null;
  created_at: string | null;
  started_at: string | null;
  finished_at: string | null;
  step: number;
  steps: number;
  last_metrics: MetricsRecord | null;
  error: JobError | null;
  eta_s: number | null;
  tokens_per_s: number | null;
  output_dir: string;
  checkpoints: string[];
}

export interface LogLine {
  seq: number;
  ts: string;
  line: string;
}

export interface Checkpoint {
  name: string;
  step?: number | null;
  bytes?: number | null;
  path?: string | null;
}

export interface Host {
  name: string;
  queue?: string | null;
  topology?: Record<string, unknown> | null;
  calibration?: Record<string, unknown> | null;
  last_seen?: string | null;
  online?: boolean | null;
}

export interface Preset {
  id: string;
  label: string;
  description?: string;
  config: Record<string, unknown>;
}

export interface Health {
  status: "ok" | "degraded" | string;
  database?: boolean;
  redis?: boolean;
  workers?: number;
}

export interface StatusEvent {
  status: string;
  error?: JobError | null;
  ts?: string;
}
