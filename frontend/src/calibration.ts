// A calibration record (docs/interfaces.md §5) as a person reads it: the shape it was measured at, when and by
// which runtime, whether it is still current, its measured rates in units people use; and which record a plan used
// or why none fitted. Pure functions: the Hosts page, the topology drawing and the plan view render what they return.
import { grouped, isNum, median, num, seconds } from "./fmt";

type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

/** current: written by this runtime's schema; upgraded: an older runtime wrote it without some shape fields, filled
 *  in from the model config; older: an older schema with a complete shape (plan previews use it, a run measures the
 *  shape again); outdated: its shape cannot be completed, no plan uses it. */
export type CalState = "current" | "upgraded" | "older" | "outdated";

export interface CalSummary {
  title: string; // "qwen3-8b at micro-batch 8 × 2048 tokens, bf16"
  model: string; // "hidden 4,096, 36 layers, 32 attention heads (8 KV heads), vocabulary 151,936"
  measured: string; // "measured 2026-11-29 00:00 UTC on 2 GPUs over NVLink"
  version: string; // "calibration schema 1 (this runtime writes 5); torch 2.11.0"
  state: CalState;
  stateText: string;
}

const FIELD_WORDS: Record<string, string> = { heads: "attention heads", kv_heads: "KV heads", vocab: "vocabulary", layers: "layers", arch: "architecture" };

function list(names: string[]): string {
  return names.length > 1 ? `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]}` : (names[0] ?? "");
}

/** An ISO timestamp as its UTC date and minute: "2026-11-29 00:00 UTC" (the same on every reader's clock). */
export function measuredAt(iso: unknown): string {
  if (typeof iso !== "string" || !iso) return "at an unknown time";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return `${d.toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

const INTERCONNECT: Record<string, string> = { nvlink: "NVLink", pcie: "PCIe", "pcie-host": "host memory (GPU peer-to-peer off)", none: "no GPU link" };

/** The shape's job part in words: model, micro-batch × sequence, precision. */
export function shapeTitle(shape: unknown): string {
  if (!isObj(shape)) return "a record without a job shape";
  const parts = [String(shape.model ?? "an unnamed model")];
  if (isNum(shape.micro_batch) && isNum(shape.seq)) parts.push(`at micro-batch ${shape.micro_batch} × ${grouped(shape.seq)} tokens`);
  return parts.join(" ") + (typeof shape.precision === "string" ? `, ${shape.precision}` : "");
}

/** The model's dimensions as the record gives them; a field it lacks says "not recorded". */
export function modelShape(shape: unknown): string {
  const s = isObj(shape) ? shape : {};
  const val = (k: string) => (isNum(s[k]) ? grouped(s[k]) : "not recorded");
  const heads = isNum(s.heads) ? `${s.heads} attention heads (${isNum(s.kv_heads) ? `${s.kv_heads} KV heads` : "KV heads not recorded"})` : "attention heads not recorded";
  return `hidden ${val("hidden")}, ${val("layers")} layers, ${heads}, vocabulary ${val("vocab")}`;
}

export function calibrationState(rec: Obj, currentSchema: unknown): CalState {
  if (typeof rec.outdated === "string" && rec.outdated) return "outdated";
  if (Array.isArray(rec.shape_upgraded) && rec.shape_upgraded.length) return "upgraded";
  if (isNum(currentSchema) && isNum(rec.schema) && rec.schema < currentSchema) return "older";
  return "current";
}

export function summarizeCalibration(rec: Obj, currentSchema: unknown): CalSummary {
  const state = calibrationState(rec, currentSchema);
  const sw = isObj(rec.software) ? rec.software : {};
  const where = [isNum(rec.world) ? `${rec.world} ${rec.device === "cpu" ? "rank" : "GPU"}${rec.world === 1 ? "" : "s"}` : null, typeof rec.interconnect === "string" && rec.world !== 1 ? `over ${INTERCONNECT[rec.interconnect] ?? rec.interconnect}` : null].filter(Boolean);
  const older = isNum(currentSchema) && isNum(rec.schema) && rec.schema < currentSchema;
  const version = [
    isNum(rec.schema) ? `calibration schema ${rec.schema}${older ? ` (this runtime writes ${currentSchema})` : ""}` : "calibration schema not recorded",
    typeof sw.slidedp === "string" ? `slidedp ${sw.slidedp}` : "slidedp version not recorded",
    typeof sw.torch === "string" ? `torch ${sw.torch}` : null,
    typeof sw.cuda === "string" ? `CUDA ${sw.cuda}` : null,
  ].filter(Boolean);
  const upgraded = Array.isArray(rec.shape_upgraded) ? rec.shape_upgraded.map((f) => FIELD_WORDS[String(f)] ?? String(f)) : [];
  const stateText = {
    current: "current: written by this runtime's calibration",
    upgraded: `upgraded: an older runtime wrote it without ${list(upgraded)}, filled in from the model config${older ? "; a run measures the shape again" : ""}`,
    older: "older schema: plan previews use it, a run measures the shape again",
    outdated: `outdated: ${String(rec.outdated ?? "")}; no plan uses it`,
  }[state];
  return {
    title: shapeTitle(rec.shape) + (rec.quick ? " (quick)" : ""),
    model: modelShape(rec.shape),
    measured: `measured ${measuredAt(rec.created_at)}${where.length ? ` on ${where.join(" ")}` : ""}`,
    version: version.join("; "),
    state,
    stateText,
  };
}

// ---------------------------------------------------------------- measured rates

function best(v: unknown): number | null {
  const xs = (Array.isArray(v) ? v : [v]).filter(isNum);
  return xs.length ? Math.max(...xs) : null;
}

/** Seconds per GiB as a rate people read: 0.558 -> "558 ms per GiB". */
export function perGiB(sPerGiB: unknown): string {
  return isNum(sPerGiB) ? `${seconds(sPerGiB)} per GiB` : "not measured";
}

export interface CopyRates {
  h2d: number | null; // one GPU copying alone, GB/s
  d2h: number | null;
  h2dAll: number | null; // each GPU while every GPU copies at once
  d2hAll: number | null;
  bidir: number | null; // both directions at once
  latencyS: number | null;
}

/** The host<->GPU copy rates of a record's `transfers` (the best over chunk sizes). */
export function copyRates(rec: unknown): CopyRates {
  const t = isObj(rec) && isObj(rec.transfers) ? rec.transfers : {};
  return {
    h2d: best(t.h2d_GBps),
    d2h: best(t.d2h_GBps),
    h2dAll: best(t.h2d_all_GBps),
    d2hAll: best(t.d2h_all_GBps),
    bidir: best(t.bidir_GBps),
    latencyS: isNum(t.latency_s) ? t.latency_s : null,
  };
}

const gbs = (v: number | null): string => (v === null ? "not measured" : `${num(v, 3)} GB/s`);

export function copyLines(c: CopyRates): string[] {
  return [
    `host → GPU: ${gbs(c.h2d)} one GPU alone, ${gbs(c.h2dAll)} per GPU with all copying at once`,
    `GPU → host: ${gbs(c.d2h)} one GPU alone, ${gbs(c.d2hAll)} per GPU with all copying at once`,
    `one GPU copying both ways at once: ${c.bidir === null ? "not measured" : `${num(c.bidir, 3)} GB/s in all`}`,
  ];
}

export interface HostDram {
  copyAloneGBps: number | null; // the GPUs' copies through host memory, nothing else running
  copyBesideUpdateGBps: number | null; // the same while the CPU update runs
  updateAlone: number | null; // s per 1e9 parameters
  updateBesideCopies: number | null;
  capacityGBps: number | null;
  threads: number | null;
}

/** Host memory shared by the GPUs' copies and the CPU update (`host_dram`; older records name the update adamw). */
export function hostDram(rec: unknown): HostDram | null {
  const d = isObj(rec) && isObj(rec.host_dram) ? rec.host_dram : null;
  if (!d) return null;
  const n = (...keys: string[]) => {
    for (const k of keys) if (isNum(d[k])) return d[k] as number;
    return null;
  };
  return {
    copyAloneGBps: n("dma_alone_GBps"),
    copyBesideUpdateGBps: n("dma_with_update_GBps", "dma_with_adamw_GBps"),
    updateAlone: n("update_alone_s_per_1e9", "adamw_alone_s_per_1e9"),
    updateBesideCopies: n("update_with_dma_s_per_1e9", "adamw_with_dma_s_per_1e9"),
    capacityGBps: n("capacity_GBps"),
    threads: n("threads"),
  };
}

/** How much a figure drops from `alone` to `beside`, as a whole percentage ("40% less"). */
function drop(alone: number | null, beside: number | null, word: string): string {
  if (alone === null || beside === null || alone <= 0) return "";
  return ` (${Math.round((100 * Math.abs(alone - beside)) / alone)}% ${word})`;
}

export function hostDramLines(d: HostDram | null): string[] {
  if (!d) return ["host memory bandwidth: not measured (a quick or CPU calibration leaves it out)"];
  return [
    `GPU copies through host memory: ${gbs(d.copyAloneGBps)} alone, ${gbs(d.copyBesideUpdateGBps)} while the CPU update runs${drop(d.copyAloneGBps, d.copyBesideUpdateGBps, "less")}`,
    `CPU update${d.threads !== null ? ` (${d.threads} threads)` : ""}: ${d.updateAlone === null ? "not measured" : `${seconds(d.updateAlone)} per 10⁹ parameters`} alone, ${d.updateBesideCopies === null ? "not measured" : seconds(d.updateBesideCopies)} beside the copies${drop(d.updateAlone, d.updateBesideCopies, "longer")}`,
    `host memory the two share: ${gbs(d.capacityGBps)}`,
  ];
}

/** A decoder layer's delivery with the bf16 cast on the GPU (calibration `delivery_cast`, schema 7): alone and
 *  beside the layer's forward, through the default cast at 64 MiB chunks and through the cast scratch. Nothing for
 *  records without it. */
export function castLines(rec: Obj): string[] {
  const d = isObj(rec.delivery_cast) ? rec.delivery_cast : null;
  if (!d) return [];
  if (typeof d.error === "string") return [`a layer's weights cast on the GPU: not measured (${d.error})`];
  const chunks = Array.isArray(d.chunk_mib) ? d.chunk_mib : [];
  const rows = Array.isArray(d.default) ? d.default : [];
  const at64 = rows[chunks.indexOf(64)];
  const both = (f: unknown): string => {
    if (!isObj(f) || !isNum(f.alone_s) || !isNum(f.beside_s)) return "not measured";
    return `${seconds(f.alone_s)} alone, ${seconds(f.beside_s)} beside its forward${drop(f.alone_s, f.beside_s, "longer")}`;
  };
  const gb = isNum(d.bytes) ? ` (${num(d.bytes / 1e9, 3)} GB of fp32)` : "";
  return [
    `a layer's weights cast on the GPU${gb}: ${both(at64)}`,
    `the same through ${isNum(d.ring_mib) ? d.ring_mib : "?"} MiB of cast scratch: ${both(d.ring)}`,
  ];
}

/** Everything a record measured about the host, one line each, in units people use. */
export function measuredLines(rec: Obj): string[] {
  // a CPU job's record measures no GPU copies: there is nothing to say "not measured" about
  const out = rec.device === "cpu" ? [] : rec.transfers ? copyLines(copyRates(rec)) : ["host ↔ GPU copies: not measured"];
  if (rec.device !== "cpu") out.push(`pinned allocation: ${perGiB(rec.pinned_alloc_s_per_gib)}`, ...hostDramLines(hostDram(rec)), ...castLines(rec));
  const cpu = isObj(rec.cpu) ? rec.cpu : null;
  if (cpu && Array.isArray(cpu.threads) && Array.isArray(cpu.copy_GBps)) {
    const i = cpu.threads.length - 1;
    out.push(`host memory copy: ${gbs(best(cpu.copy_GBps[i]))} at ${cpu.threads[i]} threads`);
  }
  out.push(...observedLines(rec));
  return out;
}

/** The host speed GPU runs planned with this record measured (calibration `observed_host`, docs/interfaces.md §5):
 *  one line per clipping state, the median of their updaters' busy time over what their plans charged, and how many
 *  runs it comes from. No plan is priced with it. */
export function observedLines(rec: Obj): string[] {
  const seen = isObj(rec.observed_host) ? rec.observed_host : null;
  if (!seen) return [];
  const out: string[] = [];
  for (const [key, words] of [["unclipped", "without clipping"], ["clipped", "with clipping"]] as const) {
    const rows = Array.isArray(seen[key]) ? (seen[key] as unknown[]).filter(isObj) : [];
    const factors = rows.map((r) => r.factor).filter((f): f is number => typeof f === "number" && f >= 0.5 && f <= 2);
    if (!factors.length) continue;
    out.push(`runs ${words}: the host update took ${median(factors).toFixed(2)}× what their plans charged (median of ${factors.length} run${factors.length === 1 ? "" : "s"})`);
  }
  return out;
}

// ---------------------------------------------------------------- which record a plan used

export interface CalibrationMatch {
  used: Obj | null;
  why_not: { record: Obj; why: string[] }[];
  run: string | null;
}

export interface MatchWords {
  used: boolean;
  text: string;
  reasons: string[]; // one line per record not used: "<title> (measured …): micro-batch 8, not 4"
  run: string | null;
  key: string | null; // the record used, as the Hosts page names it (?calibration=KEY marks it there)
}

/** The plan's calibration line: the record that priced it, or why none of the host's could and what to run. */
export function matchWords(m: unknown, note?: unknown): MatchWords | null {
  if (!isObj(m)) return null;
  const match = m as unknown as CalibrationMatch;
  if (isObj(match.used)) {
    const s = summarizeCalibration(match.used, match.used.current_schema);
    const extra = s.state === "upgraded" ? ` It is ${s.stateText}.` : s.state === "older" ? ` Its ${s.stateText}.` : "";
    return { used: true, text: `Step times from the calibration ${s.measured} for ${s.title}.${extra}`, reasons: [], run: null, key: typeof match.used.key === "string" ? match.used.key : null };
  }
  const records = Array.isArray(match.why_not) ? match.why_not : [];
  const reasons = records.map((r) => `${shapeTitle(r.record?.shape)} (${measuredAt(r.record?.created_at)}): ${(r.why ?? []).join("; ")}`);
  const head = records.length
    ? `None of this host's ${records.length} calibration${records.length === 1 ? "" : "s"} fits this job, so the plan checks memory only and predicts no step time.`
    : `This host has no calibration yet, so the plan checks memory only and predicts no step time.`;
  const detail = typeof note === "string" && note && !records.length ? ` (${note})` : "";
  return { used: false, text: head + detail, reasons, run: typeof match.run === "string" ? match.run : null, key: null };
}
