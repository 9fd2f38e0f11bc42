import { seconds, words } from "../fmt";
import { CHART_TERMS, explainPhase } from "../glossary";
import { phaseKind, phaseNames } from "../series";
import type { MetricsRecord } from "../types";
import { PALETTE, PHASE_COLOURS, type ChartSpec, type Line } from "./spec";
import { secondsTick } from "./ticks";

/**
 * Step time: the two spans that make up a step (forward, backward) stacked; the step time and the cost model's
 * prediction as lines; the host-side waits inside the spans and the updater's overlapped work as thin lines
 * (adding them to the stack would count their time twice). The warm-up step does not set the scale.
 */
export const stepTimeChart: ChartSpec = {
  id: "step-time",
  title: "Step time by phase",
  about: "The forward and backward spans make up the step and are stacked. Waits inside them (dashed) and the CPU updater's work beside them (dotted) are lines: they overlap the spans. Hover a legend entry for what it is.",
  layout(records) {
    const all = phaseNames(records);
    const spans = all.filter((p) => phaseKind(p) === "span");
    const waits = all.filter((p) => phaseKind(p) === "wait");
    const overlapped = all.filter((p) => phaseKind(p) === "overlapped");
    const hasPredicted = records.some((r) => typeof r.predicted?.step_time_s === "number");
    const hasSpans = spans.includes("forward") && records.some((r) => typeof r.predicted?.forward_span === "number");
    const colour = (p: string, i: number) => PHASE_COLOURS[p] ?? PALETTE[(i + 5) % PALETTE.length];
    const lines: Line[] = spans.map((p, i) => ({ label: words(p), hint: explainPhase(p), get: (r: MetricsRecord) => r.phases?.[p], colour: colour(p, i), format: seconds }));
    lines.push({ label: "step time", hint: CHART_TERMS.step_time.text, get: (r) => r.step_time_s, colour: "#222222", width: 1.5, format: seconds });
    waits.forEach((p, i) => {
      lines.push({ label: words(p), hint: explainPhase(p), get: (r) => r.phases?.[p], colour: colour(p, i + 2), dash: [5, 3], width: 1.5, format: seconds });
    });
    overlapped.forEach((p, i) => {
      lines.push({
        label: `${words(p)} (overlapped)`,
        hint: explainPhase(p),
        get: (r) => r.phases?.[p],
        colour: colour(p, i + 6),
        dash: [2, 3],
        width: 1.5,
        format: seconds,
        // the parts of update busy: one click away, so the default chart stays readable
        hidden: p !== "update_busy" && p.startsWith("update_"),
      });
    });
    if (hasPredicted) {
      lines.push({ label: "predicted", hint: CHART_TERMS.predicted.text, get: (r) => r.predicted?.step_time_s, colour: "#9467bd", dash: [6, 4], width: 2, format: seconds });
    }
    if (hasSpans) {
      lines.push({
        label: "predicted forward",
        hint: CHART_TERMS.predicted_forward.text,
        get: (r) => r.predicted?.forward_span,
        colour: PHASE_COLOURS.forward,
        dash: [6, 4],
        width: 1.5,
        format: seconds,
      });
    }
    return {
      signature: `${all.join(",")}|${hasPredicted}|${hasSpans}`,
      lines,
      stacked: spans.length,
      axes: [{ scale: "y", label: "time per step", side: 3, format: seconds, tick: secondsTick }],
      skipFirst: true,
      info: hasPredicted ? [] : ["No predicted step time for this job (its plan had no measured figures to time it with)."],
    };
  },
};
