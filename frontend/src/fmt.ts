// Number and time formatting shared by every page. Absent values print as an en dash, never as a guess.

export const NONE = "–";

/** The median of `xs` (not empty). */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

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

/** Seconds as a person reads them: milliseconds below 1 s (never an exponent), seconds up to two minutes, then
 *  a duration. 1.55e-4 -> "0.155 ms", 0.0123 -> "12.3 ms", 0.557 -> "557 ms", 1.5 -> "1.5 s". */
export function seconds(v: unknown): string {
  if (!isNum(v)) return NONE;
  const a = Math.abs(v);
  if (a === 0) return "0 ms";
  if (a < 0.9995) {
    const ms = v * 1000;
    if (Math.abs(ms) < 0.001) return `${ms < 0 ? "> -" : "< "}0.001 ms`;
    // three significant digits, at most three decimals: 0.155 ms, 1.55 ms, 15.5 ms, 155 ms
    const decimals = Math.max(0, Math.min(3, 2 - Math.floor(Math.log10(Math.abs(ms)))));
    return `${Number(ms.toFixed(decimals)).toLocaleString("en-US", { maximumFractionDigits: decimals })} ms`;
  }
  if (a < 120) return `${num(v, 3)} s`;
  return duration(v);
}

/** A count or rate with thousands separators: whole numbers from 100 up ("29,441"), three significant digits
 *  below ("12.5"); NaN and infinities said as such. */
export function grouped(v: unknown): string {
  if (typeof v !== "number" || !Number.isFinite(v)) return num(v);
  if (Math.abs(v) >= 100) return Math.round(v).toLocaleString("en-US");
  return num(v, 3);
}

/** Seconds between two ISO timestamps (or from one to `now`), null when either is missing or unreadable. */
export function secondsBetween(from: unknown, to: unknown, now: number = Date.now()): number | null {
  if (typeof from !== "string" || !from) return null;
  const a = Date.parse(from);
  const b = to === undefined || to === null ? now : typeof to === "string" ? Date.parse(to) : NaN;
  if (!Number.isFinite(a) || !Number.isFinite(b)) return null;
  return Math.max(0, (b - a) / 1000);
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

/** A small quantity people write in e-notation (a learning rate): "3e-4", "2.5e-5", "0.003"; no trailing zeros. */
export function sci(v: unknown): string {
  if (typeof v !== "number" || !Number.isFinite(v)) return num(v);
  const a = Math.abs(v);
  if (a === 0 || (a >= 1e-3 && a < 1e4)) return num(v, 3);
  const [m, e] = v.toExponential(2).split("e");
  return `${Number(m)}e${Number(e)}`;
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

/** The clock facts of a job, from its timestamps (docs/interfaces.md §6: started_at is the start of the last
 *  attempt): how long it has been queued, how long it has run, or how long its run took once it ended. */
export function jobClock(
  job: { status: string; created_at?: string | null; started_at?: string | null; finished_at?: string | null },
  now: number = Date.now(),
): { label: string; seconds: number; hint: string }[] {
  const out: { label: string; seconds: number; hint: string }[] = [];
  const add = (label: string, s: number | null, hint: string) => {
    if (s !== null) out.push({ label, seconds: s, hint });
  };
  if (job.status === "queued") {
    add("queued for", secondsBetween(job.created_at, null, now), "Time since the job was submitted (or resumed); it starts when a worker takes it.");
  } else if (job.status === "running") {
    add("elapsed", secondsBetween(job.started_at, null, now), "Time since this attempt started.");
  } else if (job.finished_at) {
    const ran = job.started_at ? secondsBetween(job.started_at, job.finished_at, now) : null;
    add("duration", ran, "From the start of the last attempt to its end.");
    const total = secondsBetween(job.created_at, job.finished_at, now);
    if (total !== null && (ran === null || total - ran >= 1)) {
      add("since submitted", total, "From submission to the end: time queued and earlier attempts included.");
    }
  }
  return out;
}
