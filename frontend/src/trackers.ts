// Where a job's experiment trackers write (config `report_to`, docs/interfaces.md §1): the job page shows the
// folder of its TensorBoard event files and the command that serves them.
import { h } from "./dom";
import type { Job } from "./types";

export const TENSORBOARD_DIR = "tensorboard"; // under the job's output folder (slidedp.trackers)

/** The folder of the job's TensorBoard event files, or null when the job does not report to TensorBoard.
 *  `report_to` null (the default) means TensorBoard where its package is installed. */
export function tensorboardDir(job: Pick<Job, "config" | "output_dir">): string | null {
  const to = job.config?.report_to;
  const on = to === undefined || to === null || (Array.isArray(to) && to.includes("tensorboard"));
  if (!on || !job.output_dir) return null;
  return `${job.output_dir.replace(/\/+$/, "")}/${TENSORBOARD_DIR}`;
}

/** A word as a POSIX shell reads it: as it is when it needs no quoting, else in single quotes. */
export function shellWord(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'"'"'`)}'`;
}

export function tensorboardCommand(dir: string): string {
  return `tensorboard --logdir ${shellWord(dir)}`;
}

/** The summary's TensorBoard entry: the folder and the command, or null. */
export function tensorboardFact(job: Pick<Job, "config" | "output_dir">): HTMLElement | null {
  const dir = tensorboardDir(job);
  if (!dir) return null;
  const named = Array.isArray(job.config?.report_to);
  return h(
    "span",
    {
      id: "job-tensorboard",
      title: named ? undefined : "The default tracker: the job writes these files where the tensorboard package is installed (the job log says when it is not).",
    },
    h("code", null, dir),
    h("br"),
    h("code", { class: "command" }, tensorboardCommand(dir)),
  );
}
