import { gib } from "../fmt";
import { CHART_TERMS } from "../glossary";
import { gpuCount } from "../series";
import { PALETTE, type ChartSpec, type Line } from "./spec";

const gibText = (v: number) => gib(v);

export const memoryChart: ChartSpec = {
  id: "memory",
  title: "Memory (GiB)",
  layout(records) {
    const gpus = gpuCount(records);
    const lines: Line[] = [];
    for (let g = 0; g < gpus; g++) {
      lines.push({ label: `GPU ${g} HBM peak`, hint: CHART_TERMS.hbm_peak.text, get: (r) => r.hbm_peak_gib?.[g], colour: PALETTE[g % PALETTE.length], format: gibText });
    }
    lines.push({ label: "host RSS", hint: CHART_TERMS.host_rss.text, get: (r) => r.host_rss_gib, colour: "#555555", dash: [5, 3], format: gibText });
    return { signature: String(gpus), lines, axes: [{ scale: "y", label: "GiB", side: 3, format: gibText }] };
  },
};
