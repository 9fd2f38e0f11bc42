import { sci } from "../fmt";
import { CHART_TERMS } from "../glossary";
import { column, ema, nonFiniteLossSteps } from "../series";
import type { MetricsRecord } from "../types";
import { alpha, LOSS, PALETTE, type ChartSpec, type Line } from "./spec";

/** Steps whose loss is not finite, said in words. */
function nonFiniteNote(recs: readonly MetricsRecord[]): string | null {
  const bad = nonFiniteLossSteps(recs);
  if (bad.length === 0) return null;
  return `Loss is not a finite number at ${bad.length} step${bad.length > 1 ? "s" : ""} (first: step ${bad[0]}, last: step ${bad[bad.length - 1]}).`;
}

/**
 * Training loss (raw, and its moving average when smoothing is on), eval loss where evaluation ran, and the
 * learning rate on its own axis. The loss axis can be logarithmic: a run that blows up to 1e7 and settles at 6
 * is unreadable on a linear one.
 */
export const lossChart: ChartSpec = {
  id: "loss",
  title: "Loss and learning rate",
  about: "Training loss per step; with smoothing, its moving average over the faint raw curve. Eval loss is drawn where evaluation ran. The learning rate has its own axis on the right.",
  controls: { log: true, smoothing: true },
  layout(records, view) {
    const smooth = view.smoothing > 0;
    const hasEval = records.some((r) => "eval_loss" in r && r.eval_loss !== undefined);
    const lines: Line[] = [
      // the raw loss stays the first series, faint beneath the average when smoothing is on
      { label: "loss", hint: CHART_TERMS.loss.text, get: (r) => r.loss, colour: smooth ? alpha(LOSS, 0.3) : LOSS, width: smooth ? 1 : 2, missingAs: "NaN" },
    ];
    if (smooth) {
      lines.push({
        label: "loss (smoothed)",
        hint: CHART_TERMS.loss_smoothed.text,
        get: () => undefined,
        column: (recs) => ema(column(recs, (r) => r.loss), view.smoothing),
        colour: LOSS,
        width: 2,
      });
    }
    if (hasEval) lines.push({ label: "eval loss", hint: CHART_TERMS.eval_loss.text, get: (r) => r.eval_loss, colour: "#2ca02c", width: 2, sparse: true });
    lines.push({ label: "lr", hint: CHART_TERMS.lr.text, get: (r) => r.lr, colour: PALETTE[0], scale: "lr", width: 1.5, format: sci });
    return {
      signature: `loss|${view.log}|${smooth}|${hasEval}`,
      lines,
      axes: [
        { scale: "y", label: view.log ? "loss (log)" : "loss", side: 3, log: view.log },
        { scale: "lr", label: "lr", side: 1 },
      ],
      marks: nonFiniteLossSteps,
      note: nonFiniteNote,
    };
  },
};
