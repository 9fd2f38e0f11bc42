// What the names on the job page mean, in words: the measured phases of a step (docs/interfaces.md §3), the
// lines of the charts, the terms of an execution policy (§5) and the stages of a job's start (§2, §6). One
// place, so a chart legend, the plan panel, the start-up line and the summary explain a name the same way. Shown
// as hover text (title attributes) and in the page's "What the names mean" list.

export interface Term {
  /** The name as the page shows it. */
  label: string;
  /** What it is, in a sentence or two. */
  text: string;
}

/** Measured phases of a step (metrics record `phases`) and the predicted ones (`predicted.phases`). */
export const PHASE_TERMS: Readonly<Record<string, Term>> = {
  forward: {
    label: "forward",
    text: "Span of the GPU compute stream from the step's start to the end of the first micro-batch's forward pass. Waits that fall inside it (weights still arriving, the host update of a unit not done) are included. With backward it makes up the step.",
  },
  backward: {
    label: "backward",
    text: "Span from the end of the first forward to the end of the last backward pass: the loss head, recomputed activations, the other micro-batches, and the update of units updated on the GPUs. With forward it makes up the step.",
  },
  data: {
    label: "data",
    text: "Time the issuing thread waited for the step's batches from the data loader. The loader prefetches, so this is normally near zero; it overlaps GPU work already queued.",
  },
  update_tail: {
    label: "update tail",
    text: "Host-side wait inside the spans: the issuing thread waited for the previous step's CPU update (AdamW on the host copy) of a unit before it could send that unit's new weights to the GPU. That thread runs up to the window ahead of the GPU, so this wait can overlap GPU work already queued (with clipping, layers streamed through the GPU after the norm may be what the GPU waits on instead): the GPU idled for at most this long on the host update.",
  },
  staging_wait: {
    label: "staging wait",
    text: "Host-side wait inside the spans: the backward pass waited for a free gradient staging slot, because the CPU update fell behind the gradients coming back from the GPU.",
  },
  delivery_wait: {
    label: "delivery wait",
    text: "Predicted only: GPU compute idle while waiting on transfers (weights arriving, all-gathers, offloaded activations coming back, gradient buffers).",
  },
  update_busy: {
    label: "update busy",
    text: "Seconds this rank's updater thread worked on the CPU update (AdamW on the host state and the bf16 copy), beside the GPU work. Its waits (for a gradient copy, other ranks, the norm) are not counted. Overlapped, so not a slice of the step.",
  },
  update_cast_busy: {
    label: "update cast busy",
    text: "The part of update busy spent writing the bf16 copy of each unit's weights that is sent to the GPUs after its AdamW (0 when the cast is done on the GPU, or in fp32 precision).",
  },
  update_offcpu: {
    label: "update offcpu",
    text: "The part of update busy in which the updater thread was off the CPU inside AdamW and the cast: waiting at the OpenMP team's barrier for a slower thread, or to get Python's GIL back. High values mean the CPU update is starved, not slow.",
  },
};

/** The other lines, marks and figures of the charts and the job summary. */
export const CHART_TERMS: Readonly<Record<string, Term>> = {
  step_time: { label: "step time", text: "Wall time of one optimizer step on rank 0; the forward and backward spans add up to it." },
  predicted: { label: "predicted", text: "The cost model's steady-state step time for the policy the job runs, from this host's calibration." },
  predicted_forward: {
    label: "predicted forward",
    text: "The cost model's forward span (step start to the end of the first forward), cut where the engine cuts the measured forward: compare it with the top of the forward band.",
  },
  warmup: {
    label: "warm-up step",
    text: "The first step also compiles kernels, allocates memory and fills caches, so it is much slower than the rest. The y scale follows the later steps; the first point is still drawn, cut off at the edge.",
  },
  tokens_per_s: { label: "tokens/s", text: "Tokens of the global batch (all ranks) divided by the step time." },
  tflops: {
    label: "TFLOP/s",
    text: "Model FLOPs per second over all GPUs: 6 × parameters × tokens plus attention, divided by the step time (recomputation not counted). Proportional to tokens/s.",
  },
  mfu: { label: "MFU", text: "Model FLOPs utilisation: TFLOP/s over the GPUs' peak bf16 TFLOP/s." },
  hbm_peak: { label: "HBM peak", text: "Peak GPU memory reserved by this GPU during the step." },
  host_rss: { label: "host RSS", text: "Resident host memory of all rank processes plus the shared host state (fp32 weights, AdamW moments)." },
  loss: { label: "loss", text: "Mean cross-entropy per target token over the global batch (nats/token)." },
  loss_smoothed: {
    label: "loss (smoothed)",
    text: "Exponential moving average of the loss: each point is weight × the previous average + (1 − weight) × this step's loss, corrected for the start. The raw loss stays drawn faintly beneath.",
  },
  eval_loss: { label: "eval loss", text: "Loss on the evaluation data, at the steps where evaluation ran." },
  lr: { label: "lr", text: "Learning rate used by this step's update (after warm-up and decay)." },
  grad_norm: { label: "grad norm", text: "Global L2 norm of the whole model's gradient this step, before clipping." },
  clipped: { label: "clipped", text: "Steps where clipping fired: the gradient norm was above max grad norm, so the gradient was scaled down to it." },
  clip_threshold: { label: "max grad norm", text: "The clipping threshold (optimizer.max_grad_norm); gradients with a larger norm are scaled down to it." },
  nan: { label: "NaN", text: "A red rule marks a step whose loss was not a finite number (NaN or infinite): the run diverged there." },
  warning: { label: "warning", text: "An amber rule marks a step the run raised a health warning at (a loss spike, a gradient norm of zero); the list above the charts says what it was." },
  eta: { label: "ETA", text: "Remaining steps × the last step time." },
};

/** The stages of a job's start, before its first step (docs/interfaces.md §2 on_stage, §6 `stage`), keyed as the
 *  runtime names them; the label is the name the job summary's start-up line uses. */
export const STAGE_TERMS: Readonly<Record<string, Term>> = {
  queued: { label: "queued", text: "The job waits in its host's queue until the worker, which runs one job at a time, takes it." },
  preparing: {
    label: "preparing",
    text: "The job's process has started and loads the runtime (Python, PyTorch and slidedp): a few seconds, more on a busy host.",
  },
  planning: {
    label: "planning",
    text: "The execution policy is chosen for this job on this host (AutoPolicy), or the one the job names is resolved: what stays on the GPUs, what is updated where, how the weights travel.",
  },
  calibrating: {
    label: "calibrating",
    text: "This host's speeds (copies, GPU compute, the CPU update) are measured at the job's shape for the cost model. Only when no calibration of that shape is cached: later runs skip it.",
  },
  building_host_state: {
    label: "host state",
    text: "The host state (fp32 master weights, AdamW moments and the copy sent to the GPUs) is allocated in shared memory and filled with random initial weights, unit by unit.",
  },
  loading_weights: {
    label: "loading weights",
    text: "The host state is allocated in shared memory and filled with the weights of the local model directory, unit by unit.",
  },
  loading_checkpoint: {
    label: "loading checkpoint",
    text: "The host state is filled from a checkpoint (a resumed job, or init_from): weights and AdamW moments, unit by unit.",
  },
  opening_trackers: {
    label: "trackers",
    text: "The experiment trackers the job's report_to names start their run: W&B logs in (or opens its offline folder), MLflow opens its store. TensorBoard alone takes no time.",
  },
  starting_ranks: {
    label: "ranks",
    text: "One process per GPU (or the job's CPU ranks): each joins the process group, page-locks the host state and sets up its buffers. They start while the host state is filled; this is the part of their start-up left after it.",
  },
  first_step: {
    label: "first step",
    text: "The first optimizer step. It also compiles kernels, allocates memory and fills caches, so it takes longer than the steps after it.",
  },
  training: { label: "training", text: "The start-up is over and the job runs its steps; the summary says how long each stage of the start took." },
};

/** Terms of an execution policy and its plan (docs/interfaces.md §5), keyed as the JSON names them; a value's
 *  meaning is keyed "<key>.<value>". */
export const POLICY_TERMS: Readonly<Record<string, Term>> = {
  delivery: { label: "delivery", text: "How weights travel from host memory to the GPUs each step." },
  "delivery.replicated": { label: "replicated", text: "Every GPU copies each whole unit over its own PCIe link." },
  "delivery.sharded": { label: "sharded", text: "Each GPU copies 1/N of each unit over PCIe, then the GPUs all-gather the rest between them." },
  grad_reduce: { label: "grad reduce", text: "How gradients are summed across GPUs and returned to the host." },
  "grad_reduce.gpu": { label: "gpu", text: "Reduce-scatter between the GPUs; each GPU returns its 1/N of the summed gradient to the host." },
  "grad_reduce.host": { label: "host", text: "Each GPU returns the whole unit gradient and the host sums them." },
  delivery_cast: { label: "delivery cast", text: "Where the bf16 weights sent to the GPUs are made from the fp32 master copy." },
  "delivery_cast.host": { label: "host", text: "The CPU update writes a bf16 copy in host memory; 2 bytes per parameter cross PCIe." },
  "delivery_cast.gpu": { label: "gpu", text: "The fp32 master itself crosses PCIe (4 bytes per parameter) and the GPU casts it." },
  edge_update: { label: "edge update", text: "Where the embedding and the loss head (the two largest units) are updated." },
  "edge_update.host": { label: "host", text: "CPU AdamW on the host state, like every other unit." },
  "edge_update.gpu": { label: "gpu", text: "Each GPU keeps 1/N of their fp32 weights and AdamW moments and updates them there: no host traffic for them." },
  device_layers: {
    label: "device layers",
    text: "Leading decoder layers updated on the GPUs (1/N of their fp32 weights and AdamW moments per GPU, bf16 weights kept resident) instead of on the CPU: spare GPU memory spent to take work off the host update.",
  },
  streamed_layers: {
    label: "streamed layers",
    text: "With clipping: the decoder layers right after those updated on the GPUs for good, whose update after the gradient norm runs on the GPUs — their gradients wait in GPU memory, their fp32 weights and AdamW moments cross PCIe in and back out (12 bytes per parameter each way) — while the CPU updates the other layers. The host keeps the only copy of the state.",
  },
  compiled_layers: {
    label: "compiled layers",
    text: "Whether the decoder layers run through torch.compile on the GPUs (one compiled graph serves every layer; norms, rotary embeddings and casts fused around the matrix products) instead of eager PyTorch. Each GPU compiles them once as the job starts. Left unset, the planner compiles them where calibration timed a compiled layer faster than an eager one.",
  },
  post_norm_passes: {
    label: "post-norm passes",
    text: "With clipping: the CPU's update after the gradient norm in one pass per layer (1), or in two (2): every layer's new weights first, for the next forward, then its AdamW moments. Both give the same numbers; measured, two passes were slower on our test machine, so the planner keeps one unless the job asks for two.",
  },
  activations: { label: "activations", text: "Where each decoder layer keeps what its backward pass needs, per layer (runs like “keep ×23” mean 23 layers in a row)." },
  "activations.keep": { label: "keep", text: "Activations stay in GPU memory until backward: fastest, most GPU memory." },
  "activations.checkpoint": { label: "checkpoint (recompute)", text: "Only the layer's input is saved; backward recomputes the forward first: least memory, extra compute." },
  "activations.recompute": { label: "recompute", text: "Only the layer's input is saved; backward recomputes the forward first: least memory, extra compute." },
  "activations.offload": { label: "offload", text: "Activations are copied to host memory in forward and back in backward: saves GPU memory, costs PCIe traffic." },
  resident: { label: "resident", text: "Per layer: whether its bf16 weights stay on the GPU between forward and backward instead of being sent again." },
  resident_units: { label: "resident units", text: "Decoder layers whose bf16 weights stay on the GPU between forward and backward instead of being sent again." },
  keep_layers: { label: "keep layers", text: "How many leading layers keep their activations on the GPU." },
  offload_layers: { label: "offload layers", text: "How many layers offload their activations to host memory." },
  window: { label: "window", text: "Unit buffers on each GPU that weights stream through (at least 2: one computing, one arriving)." },
  chunk_mb: { label: "chunk", text: "Size in MiB of each host↔GPU copy." },
  cast_scratch_mb: { label: "cast scratch", text: "With the bf16 cast on the GPU: MiB of fp32 scratch on each GPU that the cast reads from, in a ring of buffers on a stream of its own, so weights keep arriving while a cast waits for a long compute kernel. 0: one transfer chunk. Counted in the plan's GPU memory; left unset, the planner takes the 256 MiB it calibrated where that fits and is faster, else 0." },
  loss_chunk_tokens: { label: "loss chunk", text: "Tokens per chunk of the output head and cross-entropy, so the full fp32 logits never exist at once." },
  staging_slots: { label: "staging slots", text: "Host buffers for gradients on their way to the CPU update (max(8, window + 1)); when all are taken, backward waits (staging wait)." },
  phases: { label: "phases", text: "The predicted step split into forward, backward and the waits for the host update (update tail) and for transfers (delivery wait); they add up to the step time." },
  spans: { label: "spans", text: "The predicted step cut where the engine cuts its measured forward and backward spans." },
  exposed: { label: "exposed", text: "Seconds the step would lose if this resource's work took no time: what it costs the step beyond what overlap hides." },
  busy: { label: "busy", text: "Seconds each resource (GPU compute, copies each way, collectives, CPU) is busy per step." },
  hbm_budget: { label: "hbm budget", text: "GPU memory the plan may use per GPU." },
  host_limit: { label: "host limit", text: "Host memory the plan may use (the job's host_ram_gib, or the host's limit)." },
  tau: { label: "τ", text: "Marginal pipeline cost of one more layer with this activation policy." },
};

const ALL: Readonly<Record<string, Term>> = { ...STAGE_TERMS, ...POLICY_TERMS, ...CHART_TERMS, ...PHASE_TERMS };

/** The explanation of a term by its key ("update_tail", "grad_norm", "delivery.sharded"), or undefined. */
export function explain(key: string): string | undefined {
  return ALL[key]?.text;
}

/** A phase's hover text; a phase the page does not know yet still says what it is. */
export function explainPhase(phase: string): string {
  return PHASE_TERMS[phase]?.text ?? `A phase the runtime measures (${phase}); this page has no description of it yet.`;
}

/** The key of a label as the page shows it: "grad reduce" -> "grad_reduce", "update busy (overlapped)" ->
 *  "update_busy", "tokens/s" -> "tokens_per_s". */
export function keyOf(text: string): string {
  return text
    .trim()
    .toLowerCase()
    .replace(/\s*\(.*\)$/, "")
    .replace(/\//g, " per ")
    .replace(/[\s-]+/g, "_");
}

/** The explanation of a label as shown, with or without its unit suffix ("hbm_budget_gib" -> "hbm_budget"). */
export function explainLabel(text: string): string | undefined {
  const key = keyOf(text);
  return explain(key) ?? explain(key.replace(/_(s|gib|bytes|gbps|gb_s)$/, ""));
}

/** The meaning of a policy value as shown ("sharded", or a per-layer run "keep ×23, checkpoint ×13"). */
export function explainValue(key: string, shown: string): string | undefined {
  const names = [...new Set(shown.split(",").map((p) => p.trim().replace(/\s*×\d+$/, "")).filter(Boolean))];
  const parts = names.map((n) => (POLICY_TERMS[`${key}.${n}`] ? `${n}: ${POLICY_TERMS[`${key}.${n}`].text}` : null)).filter((x): x is string => x !== null);
  return parts.length ? parts.join("\n") : undefined;
}

/**
 * Give the names a rendered panel shows (definition lists, table headers) their hover text: a term's title says
 * what it is, a policy value's says what that choice does. Titles already set by the panel are kept in front.
 */
export function annotate(root: ParentNode): void {
  for (const dt of Array.from(root.querySelectorAll("dt"))) {
    const key = keyOf(dt.textContent ?? "");
    const text = explainLabel(key);
    if (!text) continue;
    dt.title = text;
    dt.classList.add("term");
    const dd = dt.nextElementSibling as HTMLElement | null;
    if (dd && dd.tagName === "DD" && !dd.querySelector("dl, table")) {
      const value = explainValue(key, dd.textContent ?? "");
      if (value) {
        dd.title = value;
        dd.classList.add("term");
      }
    }
  }
  for (const th of Array.from(root.querySelectorAll("th"))) {
    const raw = th.getAttribute("title") || th.textContent || "";
    const text = explainLabel(raw.split(".").pop() ?? raw) ?? explainLabel(th.textContent ?? "");
    if (!text) continue;
    th.title = text;
    th.classList.add("term");
  }
}

/** Every term as [label, text], for the page's list of what the names mean. */
export function glossaryEntries(groups: readonly Readonly<Record<string, Term>>[] = [PHASE_TERMS, CHART_TERMS, POLICY_TERMS, STAGE_TERMS]): [string, string][] {
  const out: [string, string][] = [];
  for (const g of groups) {
    for (const [key, t] of Object.entries(g)) out.push([key.includes(".") ? `${key.split(".")[0].replace(/_/g, " ")}: ${t.label}` : t.label, t.text]);
  }
  return out;
}
