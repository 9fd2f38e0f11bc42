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
  /** Loss on the evaluation data, only on the steps where evaluation ran. */
  eval_loss?: number | null;
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
  policy: Plan | null; // the plan made at submit time; after a run, stage "resolved" and the policy that ran
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
  /** Whether output_dir/tensorboard holds TensorBoard event files (docs/interfaces.md §6); absent from older servers. */
  tensorboard_events?: boolean | null;
  /** Health warnings the run raised, oldest first (docs/interfaces.md §6); absent from servers that do not report them. */
  warnings?: JobWarning[] | null;
  /** Where the current attempt's start-up is (§6): the last `stage` event; null before the attempt starts. */
  stage?: JobStage | null;
  /** A cancel asked of the running job and not yet done: "stop", or "save" (a checkpoint first). */
  cancel_request?: "stop" | "save" | string | null;
  cancel_requested_at?: string | null;
  /** What tells runs apart (docs/interfaces.md §6): only in the jobs list's answer. */
  summary?: JobSummary | null;
}

/** A job's figures in the jobs list (docs/interfaces.md §6, `summary`); null where the job has none. */
export interface JobSummary {
  /** Loss of its newest stored step (nats/token). */
  final_loss?: number | null;
  /** Eval loss of its newest step that evaluated, and that step; null when it never evaluated. */
  final_eval_loss?: number | null;
  final_eval_step?: number | null;
  /** Median tokens/s of its steps, the first (warm-up) step left out. */
  median_tokens_per_s?: number | null;
  /** Seconds it ran, summed over its attempts; growing while it runs. */
  duration_s?: number | null;
}

/** A start-up stage as on_stage reports it (docs/interfaces.md §2): `progress` with done/total while the host
 *  state is filled; "training" once the first step is done, with every stage's duration. */
export interface JobStage {
  stage: string;
  elapsed_s?: number | null;
  done?: number | null;
  total?: number | null;
  progress?: number | null;
  durations?: Record<string, number | null> | null;
  total_s?: number | null;
}

export interface JobWarning {
  step: number;
  kind: string;
  message: string;
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

/** An experiment tracker config `report_to` can name, as the server finds it (GET /api/presets `trackers`). */
export interface TrackerInfo {
  name: string;
  label: string;
  installed: boolean;
  missing: string[];
  needs: string;
  problem?: string | null;
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

/** The ExecutionPolicy JSON (docs/interfaces.md §5): one resolved policy; the lists hold one entry per decoder layer. */
export interface ExecutionPolicy {
  delivery: "replicated" | "sharded";
  grad_reduce: "gpu" | "host";
  delivery_cast: "host" | "gpu";
  edge_update: "host" | "gpu";
  device_layers: number;
  /** Absent in plans made before it existed: 0. */
  streamed_layers?: number;
  /** Absent in plans made before it existed: false. */
  compiled_layers?: boolean;
  /** With clipping, the host's update after the norm in 1 pass or 2 (weights first). Absent before it existed: 1. */
  post_norm_passes?: number;
  activations: ("keep" | "checkpoint" | "offload")[];
  resident: boolean[];
  window: number;
  chunk_mb: number;
  /** MiB of fp32 scratch for the GPU cast's ring of buffers; 0: one transfer chunk. Absent before it existed: 0. */
  cast_scratch_mb?: number;
  loss_chunk_tokens: number;
  staging_slots: number;
}

/** A plan's prediction for one policy (docs/interfaces.md §5); times are null without a calibration. */
export interface Prediction {
  step_time_s: number | null;
  tokens_per_s: number | null;
  phases: Record<string, number>;
  spans?: Record<string, number>;
  exposed: Record<string, number>;
  busy?: Record<string, number>;
  hbm_peak_gib: number | null;
  host_ram_gib: number;
  hbm_parts_gib?: Record<string, number>;
  host_parts_gib?: Record<string, number>;
  bound?: Record<string, unknown>;
}

/** One row of a plan's card sweep: the job planned with `hbm_gib` of memory on each GPU. */
export interface CardSweepRow {
  hbm_gib: number;
  fits: boolean;
  step_time_s: number | null;
  tokens_per_s: number | null;
  hbm_peak_gib: number | null;
  policy: string | null; // the chosen policy in a few words
  why_not: string | null;
  current: boolean; // the job's own setting (its gpu_memory_gib, or the whole card)
  whole_card: boolean;
}

export interface Candidate {
  policy: ExecutionPolicy;
  predicted: Prediction;
  fits: boolean;
  why_not: string | null;
}

/** The marginal pipeline cost per layer: tau_j = tau_0 + T_j k_j - T_0 k_j. */
export interface Marginal {
  k_bytes: number;
  tau_0_s: number;
  delta_s: Record<string, number>;
  tau_s: Record<string, number>;
  T_s_per_GB: Record<string, number>;
}

/** A plan's `clipping` (docs/interfaces.md §5): the chosen step against the same policy priced without clipping
 *  (`unclipped_change`: what that pricing changed, e.g. streamed_layers 0), the update's split between the host and
 *  the GPUs, and where the gradients wait for the norm. Times are null without a calibration. */
export interface ClippingCost {
  max_grad_norm: number;
  step_time_s: number | null;
  unclipped_step_time_s: number | null;
  cost_s: number | null;
  cost_fraction: number | null;
  unclipped_change: Record<string, unknown>;
  unclipped_fits: boolean | null;
  layers: number;
  host_layers: number;
  device_layers: number;
  streamed_layers: number;
  edge_update: "host" | "gpu";
  host_params: number;
  device_params: number;
  streamed_params: number;
  held_gradient_gib: number;
  held_bf16_gib: number;
  gpu_waiting_gib: number;
  gpu_waiting_bf16: boolean;
}

/** The plan's `compiled_layers`: whether the layers run through torch.compile, who decided, the calibrated times. */
export interface CompiledLayers {
  chosen: boolean;
  by: "planner" | "config";
  eager_layer_s: number | null;
  compiled_layer_s: number | null;
  compile_s: number | null;
  reason: string;
}

/** A shipped hardware profile's headline figures, as GET /api/profiles lists them (a declared host to plan for). */
export interface ProfileSummary {
  name: string;
  description: string;
  gpus: number;
  gpu_name: string;
  gpu_memory_gib: number;
  bf16_dense_tflops: number;
  pcie: string;
  p2p: boolean;
  host_ram_gib: number;
  cores: number;
  dram_gbps: number;
}

/** The plan JSON of slidedp.planning.autopolicy.plan_job (docs/interfaces.md §5) as the API answers it: from
 *  POST /api/plan (with `host` and `validation`), and as a job's policy column (with `stage`). */
export interface Plan {
  feasible: boolean;
  policy: ExecutionPolicy | null; // null when not feasible
  predicted: Prediction | null;
  candidates: Candidate[];
  marginal: Marginal | null;
  why: string;
  errors: FieldErrorItem[];
  calibration: "measured" | "missing" | "declared";
  calibration_note?: string;
  /** A plan for a declared host (POST /api/plan with `profile`): the profile it was made for. */
  declared?: { profile: string; description: string; source?: string };
  /** POST /api/plan: the host's calibration record that priced the plan, or why none could (docs/interfaces.md §6). */
  calibration_match?: { used: Record<string, unknown> | null; why_not: { record: Record<string, unknown>; why: string[] }[]; run: string | null };
  host_update?: Record<string, number>;
  job?: Record<string, unknown>;
  /** The best plan at other memory sizes per GPU (docs/interfaces.md §5); [] for CPU jobs. */
  card_sweep?: CardSweepRow[];
  /** With clipping (max_grad_norm > 0) only: what it costs this plan, who updates what, where gradients wait. */
  clipping?: ClippingCost;
  /** Compiled or eager decoder layers, who chose and why (docs/interfaces.md §5); absent where they can only be eager. */
  compiled_layers?: CompiledLayers;
  host?: string;
  stage?: "planned" | "resolved";
  /** A job's policy column after its run (stage "resolved"): the run's steady steps against this plan's prediction
   *  (TrainResult.prediction_check, docs/interfaces.md §2). */
  prediction_check?: { message: string; prediction_error: number } | null;
  validation?: FieldErrorItem[];
}
