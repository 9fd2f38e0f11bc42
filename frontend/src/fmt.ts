// Number and time formatting shared by every page. Absent values print as an en dash, never as a guess.

export const NONE = "–";

export function isNum(v: unknown): v is number {
  return typeof v === "number" && Number.isFinite(v);
}

/** A number with `digits` significant digits, grouped thousands for large values; NaN/Inf are said as such. */
export function num(v: unknown, digits = 3): string {
  if (typeof v !== "number") return NONE;
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "+Inf" : "-Inf";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e9)) return v.toExponential(Math.max(0, digits - 1));
  if (a >= 10 ** digits) return Math.round(v).toLocaleString("en-US");
  return Number(v.toPrecision(digits)).toLocaleString("en-US", { maximumFractionDigits: 6 });
}

export function seconds(v: unknown): string {
  if (!isNum(v)) return NONE;
  if (v < 1) return `${num(v * 1000, 3)} ms`;
  if (v < 120) return `${num(v, 3)} s`;
  return duration(v);
}

/** A duration like "3 h 04 min" or "42 s". */
export function duration(v: unknown): string {
  if (!isNum(v) || v < 0) return NONE;
  const s = Math.round(v);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, "0")} s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return `${hrs} h ${String(m % 60).padStart(2, "0")} min`;
  return `${Math.floor(hrs / 24)} d ${hrs % 24} h`;
}

export function gib(v: unknown): string {
  return isNum(v) ? `${num(v, 3)} GiB` : NONE;
}

export function bytes(v: unknown): string {
  if (!isNum(v)) return NONE;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let x = v;
  let i = 0;
  while (Math.abs(x) >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  return `${num(x, 3)} ${units[i]}`;
}

/** GB/s from a figure in GB/s (the calibration's unit). */
export function gbps(v: unknown): string {
  return isNum(v) ? `${num(v, 3)} GB/s` : NONE;
}

export function rate(v: unknown, unit: string): string {
  return isNum(v) ? `${num(v, 3)} ${unit}` : NONE;
}

export function percent(v: unknown): string {
  return isNum(v) ? `${num(v * 100, 3)} %` : NONE;
}

/** A local date-time from an ISO timestamp. */
export function when(iso: unknown): string {
  if (typeof iso !== "string" || !iso) return NONE;
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

/** Python-ish key names as words: "update_tail" -> "update tail". */
export function words(key: string): string {
  return key.replace(/_/g, " ");
}

/** Short tick labels: 12k, 3.5M, 0.0012, 1e-5. */
export function axisNum(v: number): string {
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1e9) return v.toExponential(1);
  if (a >= 1e6) return `${Number((v / 1e6).toPrecision(3))}M`;
  if (a >= 1e4) return `${Number((v / 1e3).toPrecision(3))}k`;
  if (a < 1e-3) return v.toExponential(1);
  return String(Number(v.toPrecision(3)));
}
