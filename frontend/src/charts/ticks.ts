// Tick labels the charts share (the job page's and the comparison's).
import { axisNum } from "../fmt";

/**
 * Labels of a log axis: its ticks sit at 1..9 × 10^k, far too many to label. Label the mantissas that fit the
 * axis' height (1, 2, 5 with room; the powers of ten when it is tight; every other power of ten when tighter).
 */
export function logTickLabels(splits: readonly number[], heightPx: number): string[] {
  const pos = splits.filter((v) => v > 0);
  if (pos.length === 0) return splits.map(() => "");
  const decades = Math.max(1, Math.log10(Math.max(...pos) / Math.min(...pos)));
  const perDecade = heightPx / decades;
  const mantissas = perDecade >= 110 ? [1, 2, 5] : perDecade >= 60 ? [1, 3] : [1];
  const everyNth = perDecade >= 22 ? 1 : Math.ceil(22 / perDecade);
  return splits.map((v) => {
    if (!(v > 0)) return "";
    const k = Math.floor(Math.log10(v) + 1e-9);
    const m = Math.round(v / 10 ** k);
    if (!mantissas.includes(m) || Math.abs(v / 10 ** k - m) > 1e-6) return "";
    if (m === 1 && k % everyNth !== 0) return "";
    return axisNum(v);
  });
}

/** A time axis tick: "0", "250 ms", "1.5 s", never an exponent. */
export function secondsTick(v: number): string {
  if (v === 0) return "0";
  if (Math.abs(v) < 1) return `${Number((v * 1000).toPrecision(3))} ms`;
  return `${Number(v.toPrecision(3))} s`;
}
