// Reading a host's topology (docs/interfaces.md §4) and its calibration (§5) defensively, and drawing it.
// A field that is absent is not drawn; nothing is estimated here.
import { svg } from "./dom";
import { type CopyRates, copyRates, type HostDram, hostDram } from "./calibration";
import { isNum, num } from "./fmt";

type Obj = Record<string, unknown>;

export interface GpuView {
  index: number;
  name: string | null;
  hbmGiB: number | null;
  pcie: string | null; // "PCIe Gen5 x16"
  numa: number | null;
  h2dGBs: number | null;
  d2hGBs: number | null;
}

export interface LinkView {
  a: number;
  b: number;
  kind: string; // "NVLink", "PCIe", or what the topology says
  detail: string | null; // e.g. "NV18"
  bandwidthGBs: number | null; // measured when the calibration gives it
  p2p: boolean | null;
}

export interface HostView {
  gpus: GpuView[];
  links: LinkView[];
  cpuModel: string | null;
  cpuCores: number | null;
  cpuThreads: number | null;
  numaNodes: number | null;
  ramGiB: number | null;
  ramSource: string | null;
  notes: string[];
  /** Host<->GPU copy rates of the calibration record that has them (null: none measured). */
  copies: CopyRates | null;
  /** Host memory shared by the GPUs' copies and the CPU update (null: not measured). */
  hostDram: HostDram | null;
  /** "torch 2.11.0+cu130", "CUDA 13.0", "NVIDIA driver not reported", … as the topology reports them. */
  software: string[];
}

const SOFTWARE: [string, string][] = [
  ["torch", "torch"],
  ["cuda", "CUDA"],
  ["driver", "NVIDIA driver"],
  ["nccl", "NCCL"],
  ["python", "Python"],
  ["transformers", "transformers"],
];

/** The software versions a topology reports, each "not reported" where it is absent. */
export function softwareLines(topology: unknown): string[] {
  const sw = pick(topology, "software");
  if (!isObj(sw)) return ["software versions not reported"];
  return SOFTWARE.map(([k, name]) => {
    const v = sw[k] ?? (k === "driver" ? sw.driver_version : undefined);
    return v === undefined || v === null || v === "" ? `${name} not reported` : `${name} ${String(v)}`;
  });
}

/** The record whose measured rates the drawing shows: the newest of those that measured copies (an outdated
 *  record's rates are still this host's). */
function ratesRecord(cal: unknown): Obj | null {
  const with_ = calibrationRecords(cal).filter((r) => isObj(r.transfers));
  if (!with_.length) return null;
  return with_.reduce((a, b) => (String(b.created_at ?? "") > String(a.created_at ?? "") ? b : a));
}

const GIB = 1024 ** 3;

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The first present value among alternative key paths ("cpu.cores"). */
export function pick(o: unknown, ...paths: string[]): unknown {
  for (const p of paths) {
    let cur: unknown = o;
    for (const part of p.split(".")) cur = isObj(cur) ? cur[part] : undefined;
    if (cur !== undefined && cur !== null) return cur;
  }
  return undefined;
}

function numOf(v: unknown): number | null {
  return isNum(v) ? v : null;
}

/** A memory size in GiB from whichever unit the key names. */
function gibOf(o: unknown, prefixes: string[]): number | null {
  for (const p of prefixes) {
    const g = numOf(pick(o, `${p}_gib`));
    if (g !== null) return g;
    const gb = numOf(pick(o, `${p}_gb`));
    if (gb !== null) return (gb * 1e9) / GIB;
    const mib = numOf(pick(o, `${p}_mib`));
    if (mib !== null) return mib / 1024;
    const b = numOf(pick(o, `${p}_bytes`, p));
    if (b !== null && b > 1e6) return b / GIB;
  }
  return null;
}

function linkKind(raw: unknown): { kind: string; detail: string | null } {
  const s = String(raw ?? "").trim();
  if (!s || s === "none") return { kind: "link not reported", detail: null };
  // NCCL_P2P_DISABLE: the pair exchanges data through host memory whatever it is wired with.
  if (s === "pcie-host") return { kind: "PCIe via host memory", detail: null };
  if (/^nv(link|\d+)/i.test(s)) return { kind: "NVLink", detail: /^nvlink$/i.test(s) ? null : s };
  if (/pci|^pix$|^pxb$|^phb$|^node$|^sys$/i.test(s)) return { kind: "PCIe", detail: /^pcie?$/i.test(s) ? null : s };
  return { kind: s, detail: null };
}

function pairBandwidth(cal: unknown, a: number, b: number): number | null {
  const m = pick(cal, "p2p_gbps", "p2p_bandwidth_gbps", "links_gbps", "nvlink_gbps");
  if (Array.isArray(m) && Array.isArray(m[a])) return numOf((m[a] as unknown[])[b]);
  if (isNum(m)) return m;
  const list = pick(cal, "links", "p2p");
  if (Array.isArray(list)) {
    for (const l of list) {
      const [x, y] = endpoints(l);
      if ((x === a && y === b) || (x === b && y === a)) return numOf(pick(l, "bandwidth_gbps", "gbps", "measured_gbps", "bandwidth_gb_s"));
    }
  }
  return null;
}

function endpoints(l: unknown): [number | null, number | null] {
  const gpus = pick(l, "gpus", "pair", "between");
  if (Array.isArray(gpus) && gpus.length === 2) return [numOf(gpus[0]), numOf(gpus[1])];
  return [numOf(pick(l, "a", "src", "from", "i", "gpu_a")), numOf(pick(l, "b", "dst", "to", "j", "gpu_b"))];
}

function perGpu(cal: unknown, keys: string[], i: number): number | null {
  const v = pick(cal, ...keys);
  if (Array.isArray(v)) return numOf(v[i]);
  if (isObj(v)) return numOf(v[String(i)]);
  return null;
}

/** Calibration records: one record, or a map of them keyed by shape ("qwen3-8b_bs8_nvlink"). */
export function calibrationRecords(cal: unknown): Obj[] {
  if (!isObj(cal)) return [];
  // What a worker reports: {"dir": where its cache is, "entries": [record, ...]}.
  if (Array.isArray(cal.entries)) return cal.entries.filter(isObj);
  if (isObj(cal.transfers) || isObj(cal.unit) || isObj(cal.cpu)) return [cal];
  return Object.values(cal).filter((r): r is Obj => isObj(r) && (isObj(r.transfers) || isObj(r.unit) || isObj(r.cpu)));
}

/** The host<->GPU copy rate a calibration measured for one GPU alone, in GB/s (best over records and chunk
 *  sizes). `transfers.per_gpu` has every GPU; the older `h2d_GBps` list is GPU 0's alone, so it says nothing
 *  about the other GPUs. */
function measuredCopy(cal: unknown, dir: "h2d" | "d2h", gpu: number): number | null {
  let best: number | null = null;
  const take = (x: unknown) => {
    if (isNum(x) && (best === null || x > best)) best = x;
  };
  for (const r of calibrationRecords(cal)) {
    const per = pick(r, "transfers.per_gpu");
    if (Array.isArray(per)) {
      for (const e of per) if (isObj(e) && (e.gpu ?? -1) === gpu) take(e[`${dir}_GBps`] ?? e[`${dir}_gbps`]);
      continue;
    }
    if (gpu !== 0) continue;
    const v = pick(r, `transfers.${dir}_GBps`, `transfers.${dir}_gbps`);
    for (const x of Array.isArray(v) ? v : [v]) take(x);
  }
  return best;
}

/** What the topology and calibration say about a host, with absent fields left null. */
export function readHost(topology: unknown, calibration: unknown): HostView {
  const rawGpus = pick(topology, "gpus", "devices");
  const gpus: GpuView[] = Array.isArray(rawGpus)
    ? rawGpus.map((g, i) => {
        const gen = pick(g, "pcie_gen", "pcie.gen", "pcie.generation", "pcie_generation");
        const width = pick(g, "pcie_width", "pcie.width", "pcie.link_width", "pcie_link_width");
        const maxGen = pick(g, "pcie.max_gen", "pcie_max_gen");
        const maxWidth = pick(g, "pcie.max_width", "pcie_max_width");
        let pcie = gen !== undefined || width !== undefined ? `PCIe${gen !== undefined ? ` Gen${gen}` : ""}${width !== undefined ? ` x${width}` : ""}` : null;
        // A link trained below its maximum (power saving at idle, a riser) is worth seeing.
        if (pcie && ((maxGen !== undefined && maxGen !== gen) || (maxWidth !== undefined && maxWidth !== width))) {
          pcie += ` (max${maxGen !== undefined ? ` Gen${maxGen}` : ""}${maxWidth !== undefined ? ` x${maxWidth}` : ""})`;
        }
        const index = numOf(pick(g, "index", "id", "ordinal")) ?? i;
        return {
          index,
          name: (pick(g, "name", "model") as string | undefined) ?? null,
          hbmGiB: gibOf(g, ["hbm", "memory", "total_memory", "mem"]),
          pcie,
          numa: numOf(pick(g, "numa_node", "numa")),
          h2dGBs: numOf(pick(g, "h2d_gbps")) ?? perGpu(calibration, ["h2d_gbps", "h2d.gbps", "h2d_bandwidth_gbps"], index) ?? measuredCopy(calibration, "h2d", index),
          d2hGBs: numOf(pick(g, "d2h_gbps")) ?? perGpu(calibration, ["d2h_gbps", "d2h.gbps", "d2h_bandwidth_gbps"], index) ?? measuredCopy(calibration, "d2h", index),
        };
      })
    : [];
  const links: LinkView[] = [];
  const rawLinks = pick(topology, "links", "p2p", "gpu_links");
  if (Array.isArray(rawLinks) && rawLinks.length && Array.isArray(rawLinks[0])) {
    // A matrix: links[i][j] names the connection of GPUs i and j.
    for (let a = 0; a < rawLinks.length; a++) {
      for (let b = a + 1; b < (rawLinks[a] as unknown[]).length; b++) {
        const cell = (rawLinks[a] as unknown[])[b];
        const { kind, detail } = linkKind(isObj(cell) ? pick(cell, "kind", "type", "link") : cell);
        const bw = (isObj(cell) ? numOf(pick(cell, "bandwidth_gbps", "gbps", "measured_gbps")) : null) ?? pairBandwidth(calibration, a, b);
        links.push({ a, b, kind, detail, bandwidthGBs: bw, p2p: isObj(cell) ? ((pick(cell, "p2p") as boolean | undefined) ?? null) : null });
      }
    }
  } else if (Array.isArray(rawLinks)) {
    for (const l of rawLinks) {
      const [a, b] = endpoints(l);
      if (a === null || b === null) continue;
      const named = linkKind(pick(l, "kind", "type", "link", "via"));
      const kind = named.kind;
      const detailRaw = pick(l, "detail");
      const detail = typeof detailRaw === "string" && detailRaw ? detailRaw : named.detail;
      const bw = numOf(pick(l, "measured_gbps", "bandwidth_gbps", "gbps", "bandwidth_gb_s")) ?? pairBandwidth(calibration, a, b);
      const p2p = pick(l, "p2p");
      links.push({ a, b, kind, detail, bandwidthGBs: bw, p2p: typeof p2p === "boolean" ? p2p : null });
    }
  }
  const numa = pick(topology, "numa_nodes", "numa", "cpu.numa_nodes");
  return {
    gpus,
    links,
    cpuModel: (pick(topology, "cpu_model", "cpu.model", "cpu.name") as string | undefined) ?? null,
    cpuCores: numOf(pick(topology, "cpu_cores", "cpu.cores", "cpu.physical_cores", "cores", "physical_cores")),
    cpuThreads: numOf(pick(topology, "cpu_threads", "cpu.threads", "cpu.logical_cpus", "cpu.logical_cores", "logical_cores")),
    numaNodes: Array.isArray(numa) ? numa.length : numOf(numa),
    ramGiB: gibOf(pick(topology, "host_ram"), ["limit"]) ?? gibOf(topology, ["host_ram", "ram", "host_memory", "mem_total", "memory"]),
    ramSource: (pick(topology, "host_ram.source") as string | undefined) ?? null,
    notes: (() => {
      const n = pick(topology, "notes");
      return Array.isArray(n) ? n.map(String) : [];
    })(),
    copies: ratesRecord(calibration) ? copyRates(ratesRecord(calibration)) : null,
    hostDram: (() => {
      const r = calibrationRecords(calibration).find((x) => isObj(x.host_dram));
      return r ? hostDram(r) : null;
    })(),
    software: softwareLines(topology),
  };
}

function linkLabel(l: LinkView): string {
  const parts = [l.kind];
  if (l.detail) parts.push(`(${l.detail})`);
  if (l.bandwidthGBs !== null) parts.push(`${num(l.bandwidthGBs, 3)} GB/s`);
  return parts.join(" ");
}

/** The host as an SVG diagram: CPU and RAM on top, GPUs below joined to it by PCIe, GPU pairs by their links. */
export function drawHost(v: HostView, hostName: string): SVGSVGElement {
  const n = Math.max(1, v.gpus.length);
  const gpuW = 150;
  const gap = 90; // room for each GPU's link label (PCIe, copy rates, NUMA node) beside its line
  const width = Math.max(600, n * gpuW + (n - 1) * gap + 160);
  const arcRows = v.gpus.length > 1 ? Math.min(v.links.length, 6) : 0;
  const cpuLines = [
    v.cpuModel,
    v.cpuCores !== null ? `${v.cpuCores} CPU cores${v.cpuThreads !== null ? ` / ${v.cpuThreads} threads` : ""}` : null,
    v.numaNodes !== null ? `${v.numaNodes} NUMA node${v.numaNodes === 1 ? "" : "s"}` : null,
    v.ramGiB !== null ? `${num(v.ramGiB, 3)} GiB host RAM${v.ramSource ? ` (${v.ramSource})` : ""}` : null,
  ].filter((s): s is string => !!s);
  // The measured figures of host memory and of all GPUs copying at once: they belong to the host, not to one GPU.
  const d = v.hostDram;
  const memLine =
    d && d.copyAloneGBps !== null
      ? `memory: GPU copies ${num(d.copyAloneGBps, 3)} GB/s, ${d.copyBesideUpdateGBps !== null ? `${num(d.copyBesideUpdateGBps, 3)} GB/s during the CPU update${d.copyAloneGBps > 0 ? ` (−${Math.round((100 * (d.copyAloneGBps - d.copyBesideUpdateGBps)) / d.copyAloneGBps)}%)` : ""}` : "during the CPU update not measured"}`
      : "memory bandwidth: not measured";
  const c = v.copies;
  const allLine = c && (c.h2dAll !== null || c.d2hAll !== null) ? `all GPUs at once: ↓${c.h2dAll !== null ? num(c.h2dAll, 3) : "–"} ↑${c.d2hAll !== null ? num(c.d2hAll, 3) : "–"} GB/s per GPU` : "all GPUs at once: copies not measured";
  const hostLines = [...cpuLines.slice(0, 4), ...(v.gpus.length ? [memLine, allLine] : []), v.software.filter((x) => !/Python|transformers/.test(x)).join(" · ")];
  const hostH = 34 + hostLines.length * 15;
  const gpuY = hostH + 10 + 78;
  const height = v.gpus.length === 0 ? hostH + 70 : gpuY + 100 + arcRows * 26 + (v.links.length > 6 ? 20 : 0);
  // Drawn at its natural size (text stays text-sized), shrunk only when the page is narrower.
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "topology" });
  root.append(svg("title", {}, `Topology of ${hostName}`));
  const hostW = Math.min(width - 40, 560);
  const hostX = (width - hostW) / 2;
  root.append(
    svg("rect", { x: hostX, y: 10, width: hostW, height: hostH, rx: 8, class: "topo-host" }),
    svg("text", { x: width / 2, y: 30, "text-anchor": "middle", class: "topo-title" }, `Host ${hostName}`),
  );
  hostLines.forEach((t, i) => root.append(svg("text", { x: width / 2, y: 48 + i * 15, "text-anchor": "middle", class: i >= cpuLines.length ? "topo-small" : "" }, t)));
  if (v.gpus.length === 0) {
    root.append(svg("text", { x: width / 2, y: hostH + 50, "text-anchor": "middle", class: "topo-small" }, "No GPU reported (CPU training only)"));
    return root;
  }
  const x0 = (width - (n * gpuW + (n - 1) * gap)) / 2;
  const centre = (i: number) => x0 + i * (gpuW + gap) + gpuW / 2;
  v.gpus.forEach((g, i) => {
    const cx = centre(i);
    root.append(svg("line", { x1: cx, y1: 10 + hostH, x2: cx, y2: gpuY, class: "topo-pcie" }));
    const alone = g.h2dGBs !== null || g.d2hGBs !== null ? `alone ↓${g.h2dGBs !== null ? num(g.h2dGBs, 3) : "–"} ↑${g.d2hGBs !== null ? num(g.d2hGBs, 3) : "–"} GB/s` : "copy rate not measured";
    const label = [g.pcie ?? "PCIe", alone, g.numa !== null ? `NUMA node ${g.numa}` : "NUMA node not reported"];
    label.forEach((t, k) => root.append(svg("text", { x: cx + 6, y: hostH + 32 + k * 14, class: "topo-small" }, t)));
    root.append(
      svg("rect", { x: cx - gpuW / 2, y: gpuY, width: gpuW, height: 62, rx: 6, class: "topo-gpu" }),
      svg("text", { x: cx, y: gpuY + 18, "text-anchor": "middle", class: "topo-title" }, `GPU ${g.index}`),
    );
    if (g.name) root.append(svg("text", { x: cx, y: gpuY + 34, "text-anchor": "middle", class: "topo-small" }, g.name.length > 24 ? g.name.slice(0, 23) + "…" : g.name));
    if (g.hbmGiB !== null) root.append(svg("text", { x: cx, y: gpuY + 50, "text-anchor": "middle" }, `${num(g.hbmGiB, 4)} GiB HBM`));
  });
  // GPU-to-GPU links as arcs under the GPUs, one row each (the table below lists all of them).
  const byIndex = new Map(v.gpus.map((g, i) => [g.index, i]));
  v.links.slice(0, 6).forEach((l, k) => {
    const ia = byIndex.get(l.a);
    const ib = byIndex.get(l.b);
    if (ia === undefined || ib === undefined) return;
    const xa = centre(ia);
    const xb = centre(ib);
    const y = gpuY + 62;
    const depth = 18 + k * 26;
    const cls = l.kind === "NVLink" ? "topo-nvlink" : "topo-link";
    root.append(
      svg("path", { d: `M ${xa} ${y} C ${xa} ${y + depth}, ${xb} ${y + depth}, ${xb} ${y}`, class: cls }),
      svg("text", { x: (xa + xb) / 2, y: y + depth * 0.75 + 12, "text-anchor": "middle", class: "topo-small" }, `${l.a}–${l.b}: ${linkLabel(l)}${l.bandwidthGBs === null ? ", bandwidth not measured" : ""}`),
    );
  });
  if (v.links.length > 6) root.append(svg("text", { x: width / 2, y: height - 6, "text-anchor": "middle", class: "topo-small" }, `${v.links.length - 6} more links in the table`));
  return root;
}

export { linkLabel };
