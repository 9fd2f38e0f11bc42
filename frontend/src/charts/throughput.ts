import { grouped, num, percent } from "../fmt";
import { CHART_TERMS } from "../glossary";
import { onGpus } from "../series";
import type { MetricsRecord } from "../types";
import { PALETTE, type ChartSpec } from "./spec";

const tokensText = (v: number) => `${grouped(v)} tokens/s`;

/** Median of the finite values of the last `n` records' key. */
function recentMedian(records: readonly MetricsRecord[], get: (r: MetricsRecord) => unknown, n: number): number | null {
  const vals = records
    .slice(-n)
    .map(get)
    .filter((v): v is number => typeof v === "number" && Number.isFinite(v))
    .sort((a, b) => a - b);
  if (!vals.length) return null;
  const m = vals.length >> 1;
  return vals.length % 2 ? vals[m] : (vals[m - 1] + vals[m]) / 2;
}

/**
 * Throughput in tokens/s, one axis. TFLOP/s is proportional to it (model FLOPs per token × tokens/s), so it is
 * said in figures on GPU runs instead of drawn as a second line that would lie on top of the first.
 */
export const throughputChart: ChartSpec = {
  id: "throughput",
  title: "Throughput (tokens/s)",
  about: CHART_TERMS.tokens_per_s.text,
  layout(records) {
    const info: string[] = [];
    const tf = recentMedian(records, (r) => r.tflops, 20);
    if (onGpus(records) && tf !== null && tf > 0) {
      const mfu = recentMedian(records, (r) => r.mfu, 20);
      const n = Math.min(20, records.length);
      info.push(`Model compute: ${num(tf, 4)} TFLOP/s${mfu !== null ? ` (MFU ${percent(mfu)})` : ""}, median of the last ${n} step${n > 1 ? "s" : ""}.`);
    }
    return {
      signature: "tokens",
      lines: [{ label: "tokens/s", hint: CHART_TERMS.tokens_per_s.text, get: (r) => r.tokens_per_s, colour: PALETTE[0], format: tokensText }],
      axes: [{ scale: "y", label: "tokens/s", side: 3, format: tokensText }],
      skipFirst: true,
      info,
    };
  },
};
