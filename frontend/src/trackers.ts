// Where a job's experiment trackers write (config `report_to`, docs/interfaces.md §1): the job page shows the
// folder of its TensorBoard event files and the command that serves them.
import { h } from "./dom";
import { TERMINAL_STATUSES, type Job } from "./types";

export const TENSORBOARD_DIR = "tensorboard"; // under the job's output folder (slidedp.trackers)

type TrackedJob = Pick<Job, "config" | "output_dir" | "tensorboard_events">;

/** Whether the job reports to TensorBoard: `report_to` null (the default) means TensorBoard where its package
 *  is installed, a list must name it. */
export function reportsToTensorboard(job: Pick<Job, "config">): boolean {
  const to = job.config?.report_to;
  return to === undefined || to === null || (Array.isArray(to) && to.includes("tensorboard"));
}

/** The folder of the job's TensorBoard event files, or null when there are none to read: the job does not report
 *  to TensorBoard, or the API says the folder holds no event files (`tensorboard_events`, docs/interfaces.md §6:
 *  not yet, or the tensorboard package is missing where it ran). A server that does not say is taken at the
 *  config's word. */
export function tensorboardDir(job: TrackedJob): string | null {
  if (!reportsToTensorboard(job) || !job.output_dir || job.tensorboard_events === false) return null;
  return `${job.output_dir.replace(/\/+$/, "")}/${TENSORBOARD_DIR}`;
}

/** A word as a POSIX shell reads it: as it is when it needs no quoting, else in single quotes. */
export function shellWord(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'"'"'`)}'`;
}

export function tensorboardCommand(dir: string): string {
  return `tensorboard --logdir ${shellWord(dir)}`;
}

/** The summary's TensorBoard entry: the folder and the command when event files exist; a line saying there are
 *  none when the job asked for TensorBoard and none were written; else null. */
export function tensorboardFact(job: TrackedJob & Pick<Job, "status">): HTMLElement | null {
  const dir = tensorboardDir(job);
  if (!dir) {
    if (!reportsToTensorboard(job) || !job.output_dir) return null;
    const over = TERMINAL_STATUSES.has(String(job.status));
    return h(
      "span",
      {
        id: "job-tensorboard",
        class: "muted",
        dataset: { events: "none" },
        title: over
          ? "The job wrote no TensorBoard event files: where it ran the tensorboard package is missing (the job log says so), or it stopped before its first step. pip install 'slidedp[web]' or 'slidedp[trackers]' there to have them."
          : "The event files appear after the job's first step, where the tensorboard package is installed.",
      },
      over ? "no event files written" : "no event files yet",
    );
  }
  const named = Array.isArray(job.config?.report_to);
  return h(
    "span",
    {
      id: "job-tensorboard",
      dataset: { events: "written" },
      title: named ? undefined : "The default tracker: the job's metrics as TensorBoard event files.",
    },
    h("code", null, dir),
    h("br"),
    h("code", { class: "command" }, tensorboardCommand(dir)),
  );
}
