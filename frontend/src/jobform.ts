// The job form's layout in words: every config key's section and plain label (pages/newjob.ts draws them, the
// compare page names config differences with them), and the experiment-tracker checkboxes' value. Types, choices,
// defaults and help text come from the API's schema of JobConfig (schema.ts). No DOM here.
import type { KeyInfo } from "./schema";

export type Kind = KeyInfo["type"];

export interface Slot {
  path: string;
  label: string;
  kind: Kind; // used when the API's schema is not available
}

export interface Group {
  id: string;
  title: string;
  /** One line under the section's title: what the section decides. */
  intro?: string;
  slots: Slot[];
}

const s = (path: string, label: string, kind: Kind): Slot => ({ path, label, kind });

/** The config key the tracker checkboxes set (config `report_to`). */
export const TRACKERS_KEY = "report_to";
/** The trackers report_to can name, in the order the form shows them (slidedp.trackers). */
export const TRACKER_NAMES = ["tensorboard", "wandb", "mlflow"] as const;
export const TRACKER_LABELS: Readonly<Record<string, string>> = { tensorboard: "TensorBoard", wandb: "Weights & Biases", mlflow: "MLflow" };

// Layout only: types, choices, defaults and docs come from the API's schema of JobConfig when it answers.
export const GROUPS: Group[] = [
  { id: "model", title: "Model and data", slots: [s("model", "Model (preset name or local directory)", "string"), s("data.path", "Dataset path", "string"), s("data.format", "Dataset format", "enum"), s("data.text_field", "Text field", "string"), s("data.pack", "Pack examples", "boolean"), s("data.shuffle", "Shuffle", "boolean"), s("data.seed", "Data seed", "integer")] },
  { id: "batch", title: "Batch and length", slots: [s("seq_len", "Sequence length", "integer"), s("micro_batch_size", "Micro-batch size", "integer"), s("grad_accum", "Gradient accumulation", "integer"), s("steps", "Steps", "integer")] },
  { id: "optimizer", title: "Optimizer (AdamW)", slots: [s("optimizer.lr", "Learning rate", "number"), s("optimizer.weight_decay", "Weight decay", "number"), s("optimizer.betas", "Betas", "pair"), s("optimizer.eps", "Epsilon", "number"), s("optimizer.max_grad_norm", "Max grad norm (0: no clipping)", "number")] },
  { id: "schedule", title: "Learning-rate schedule", slots: [s("schedule.warmup_steps", "Warmup steps", "integer"), s("schedule.decay", "Decay", "enum"), s("schedule.min_lr_ratio", "Min lr ratio", "number")] },
  { id: "hardware", title: "Hardware", slots: [s("gpus", "GPUs (0: CPU)", "integer"), s("ranks", "CPU ranks (when GPUs = 0)", "integer"), s("precision", "Precision", "enum"), s("cpu_threads", "CPU threads per rank", "integer"), s("host_ram_gib", "Host RAM for the job (GiB)", "number"), s("gpu_memory_gib", "GPU memory per GPU (GiB)", "number")] },
  { id: "policy", title: "Policy overrides", slots: [s("policy.delivery", "Parameter delivery", "enum"), s("policy.grad_reduce", "Gradient reduction", "enum"), s("policy.delivery_cast", "bf16 cast on", "enum"), s("policy.edge_update", "Embedding / head update on", "enum"), s("policy.activations", "Activations", "enum"), s("policy.keep_layers", "Keep layers", "integer"), s("policy.offload_layers", "Offload layers", "integer"), s("policy.window", "Window (unit buffers)", "integer"), s("policy.chunk_mb", "Transfer chunk (MiB)", "integer"), s("policy.cast_scratch_mb", "GPU cast scratch (MiB)", "integer"), s("policy.loss_chunk_tokens", "Loss chunk (tokens)", "integer"), s("policy.resident_units", "Resident units", "integer"), s("policy.device_layers", "Layers updated on the GPUs", "integer"), s("policy.streamed_layers", "Layers streamed through the GPUs after the norm", "integer"), s("policy.compiled_layers", "Compile the decoder layers (torch.compile)", "boolean")] },
  {
    id: "eval",
    title: "Evaluation",
    intro: "Loss on data the job does not train on: a held-out share of the training data or a file of its own.",
    slots: [s("eval.holdout", "Held-out share of the training data", "number"), s("eval.path", "Evaluation dataset path", "string"), s("eval.interval", "Evaluate every N steps (0: first and last only)", "integer"), s("eval.max_batches", "Micro-batches per evaluation", "integer"), s("eval.keep_best", "Keep the best checkpoint (lowest eval loss)", "boolean")],
  },
  {
    id: "health",
    title: "Health checks",
    intro: "What the run watches for at every step, and what it does when it sees it.",
    slots: [s("health.on_warning", "When a check warns", "enum"), s("health.loss_spike_factor", "Loss spike: times the lowest loss so far", "number"), s("health.spike_recovery_steps", "Steps a loss spike may take to recover", "integer"), s("health.zero_grad_steps", "Steps of zero gradient before a warning (0: off)", "integer"), s("health.on_dead", "When the run is dead (no finite loss)", "enum")],
  },
  { id: "trackers", title: "Experiment trackers", intro: "Where the job's metrics and config go besides this workbench.", slots: [s(TRACKERS_KEY, "Report to", "unknown")] },
  {
    id: "init",
    title: "Start from an earlier run",
    intro: "Start from the weights of a checkpoint of an earlier run of the same model shape instead of the model's own.",
    slots: [s("init_from.job", "Job whose newest checkpoint to start from", "integer"), s("init_from.checkpoint", "Checkpoint folder to start from", "string")],
  },
  { id: "output", title: "Checkpoints and output", slots: [s("checkpoint.interval", "Checkpoint every K steps (0: off)", "integer"), s("checkpoint.keep", "Keep checkpoints", "integer"), s("output_dir", "Output directory", "string"), s("resume", "Resume from newest checkpoint", "boolean"), s("export", "Export HF model at the end", "boolean"), s("seed", "Seed", "integer"), s("deterministic", "Deterministic kernels", "boolean")] },
];

const LABELS: ReadonlyMap<string, string> = new Map([
  ["name", "Job name"],
  ["host", "Host"],
  ...GROUPS.flatMap((g) => g.slots.map((x): [string, string] => [x.path, x.label])),
]);

/** A config key's plain label: the form's, else its dotted path in words ("eval.max_batches" -> "eval: max batches"). */
export function fieldLabel(path: string): string {
  const known = LABELS.get(path);
  if (known) return known;
  const parts = path.split(".").map((p) => p.replace(/_/g, " "));
  return parts.length > 1 ? `${parts.slice(0, -1).join(" ")}: ${parts[parts.length - 1]}` : parts[0];
}

/** The trackers a `report_to` value turns on, as the checkboxes show them: null or absent is the default,
 *  TensorBoard; a list names its own (unknown names and "none" are not boxes). */
export function checkedTrackers(reportTo: unknown): string[] {
  if (reportTo === undefined || reportTo === null) return ["tensorboard"];
  if (!Array.isArray(reportTo)) return [];
  return TRACKER_NAMES.filter((t) => reportTo.includes(t));
}

/** The `report_to` the checkboxes send: left out (undefined, the default) when only TensorBoard is ticked, so the
 *  form sends what it always sent; the ticked names in order otherwise; ["none"] when none is. */
export function reportToValue(checked: readonly string[]): string[] | undefined {
  const on = TRACKER_NAMES.filter((t) => checked.includes(t));
  if (on.length === 1 && on[0] === "tensorboard") return undefined;
  return on.length ? [...on] : ["none"];
}
