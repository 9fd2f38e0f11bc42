import { num } from "../fmt";
import { CHART_TERMS } from "../glossary";
import { maxGradNorm, PALETTE, WARN, type ChartSpec, type Line } from "./spec";

/** The global gradient norm, the steps where clipping fired, and the clipping threshold. */
export const gradNormChart: ChartSpec = {
  id: "grad-norm",
  title: "Gradient norm",
  about: CHART_TERMS.grad_norm.text,
  controls: { log: true },
  layout(records, view, ctx) {
    const max = maxGradNorm(ctx.job);
    const has = records.some((r) => typeof r.grad_norm === "number");
    const clipped = records.filter((r) => r.clipped === true).length;
    const lines: Line[] = [
      { label: "grad norm", hint: CHART_TERMS.grad_norm.text, get: (r) => r.grad_norm, colour: PALETTE[6], width: 1.5 },
      {
        label: "clipped",
        hint: CHART_TERMS.clipped.text,
        get: (r) => (r.clipped === true ? r.grad_norm : null),
        describe: (r) => (r.clipped === true ? "yes" : r.clipped === false ? "no" : "–"),
        colour: WARN,
        pointsOnly: true,
      },
    ];
    if (max !== null) lines.push({ label: "max grad norm", hint: CHART_TERMS.clip_threshold.text, get: () => max, colour: "#7f7f7f", dash: [6, 4], width: 1 });
    const info: string[] = [];
    if (!has) info.push("These records carry no gradient norm.");
    else if (max === null) info.push(`No clipping (max grad norm 0): the norm is reported only.${clipped ? ` ${clipped} step${clipped > 1 ? "s" : ""} reported clipped.` : ""}`);
    else info.push(`Clipped at ${clipped} of ${records.length} step${records.length > 1 ? "s" : ""} (max grad norm ${num(max, 4)}).`);
    return {
      signature: `grad|${view.log}|${max}`,
      lines,
      axes: [{ scale: "y", label: view.log ? "L2 norm (log)" : "L2 norm", side: 3, log: view.log }],
      info,
    };
  },
};
