// Hosts: each worker host's detected topology as a diagram, with the measured figures its calibration gives.
import { api, request } from "../api";
import { facts, h, replace } from "../dom";
import { gbps, gib, when } from "../fmt";
import { apiAbsent } from "../health";
import { kvList } from "../plan";
import type { Cleanup } from "../router";
import { type CalState, measuredLines, summarizeCalibration } from "../calibration";
import { calibrationRecords, drawHost, linkLabel, readHost } from "../topology";
import type { Host } from "../types";
import { errorBox } from "../ui";

const NO_CALIBRATION =
  "No calibration yet: plans for this host check memory only and predict no times until a job has run on it. " +
  "A job's first run calibrates the host at its shape (seconds on a CPU, 15-25 s on a GPU), the " +
  "figures are kept for the next runs of that shape, and plans then predict step times.";

const STATE_BADGE: Record<CalState, string> = { current: "ok", upgraded: "ok", older: "warn", outdated: "bad" };

/** One calibration record as a person reads it: its job shape, the model's dimensions, when and by which runtime it
 *  was measured, whether it is current, and its measured rates; the raw record folded below. */
function calibrationRecord(r: Record<string, unknown>, currentSchema: unknown, planned: string | null): HTMLElement {
  const s = summarizeCalibration(r, currentSchema);
  const matches = planned !== null && r.key === planned; // the record the plan preview's link named
  return h(
    "div",
    { class: `calibration cal-${s.state}${matches ? " cal-planned" : ""}`, "data-state": s.state },
    h("h4", null, h("span", { class: `badge ${STATE_BADGE[s.state]}` }, s.state), " ", matches ? h("span", { class: "badge ok" }, "matches the job being planned") : null, matches ? " " : null, s.title),
    h("ul", { class: "cal-summary" }, [s.model, s.measured, s.version, s.stateText].map((t) => h("li", null, t))),
    h("ul", { class: "cal-measured" }, measuredLines(r).map((t) => h("li", null, t))),
    h("details", { class: "raw" }, h("summary", null, "Raw record"), h("pre", null, JSON.stringify(r, null, 2))),
  );
}

/** The calibration's records (one per measured job shape), each summarised. */
function calibration(host: Host): HTMLElement {
  const records = calibrationRecords(host.calibration);
  if (!host.calibration) return h("p", { class: "muted" }, NO_CALIBRATION);
  if (!records.length) {
    // A worker with an empty cache reports {"dir", "entries": []}: nothing measured yet.
    if (Array.isArray((host.calibration as Record<string, unknown>).entries)) return h("p", { class: "muted" }, NO_CALIBRATION);
    return h("details", null, h("summary", null, "Calibration"), kvList(host.calibration, new Set(), true));
  }
  const { dir, current_schema: currentSchema } = host.calibration as Record<string, unknown>;
  return h(
    "section",
    { class: "calibrations", "aria-label": "Calibrations" },
    h("h3", null, `Calibration: ${records.length} measured shape${records.length === 1 ? "" : "s"}`),
    typeof dir === "string" ? h("p", { class: "muted" }, "Cached in ", h("code", null, dir)) : null,
    records.map((r) => calibrationRecord(r, currentSchema, new URLSearchParams(location.search).get("calibration"))),
  );
}

/** The marker the API puts on a host imported from a saved-host file (docs/interfaces.md §6 POST /api/hosts/import),
 *  null for a worker's host. */
export function importedOf(host: Host): { name: string; file: string; savedAt: string } | null {
  const m = (host.topology ?? {}).imported as Record<string, unknown> | undefined;
  if (!m || typeof m !== "object") return null;
  return { name: String(m.name ?? host.name), file: String(m.file ?? "saved host"), savedAt: String(m.saved_at ?? "") };
}

/** What the page says of an imported host: where it came from, and that it is planned for but never runs a job. */
export function importedNote(imp: { file: string; savedAt: string }): string {
  return (
    `Imported from ${imp.file}, saved ${imp.savedAt.slice(0, 10)}. The plan preview can plan jobs for this host ` +
    "(pick it as the job's host), but it never receives jobs: no worker runs here. Start a worker on that machine " +
    "(slidedp worker) to train there."
  );
}

/** The saved host a chosen file holds, parsed, or the reason it is not one (the API checks it fully). */
export function readSavedHost(text: string): { body: unknown } | { error: string } {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return { error: "the file is not JSON: choose the file `slidedp topology --save FILE` wrote on the host" };
  }
  if (!body || typeof body !== "object" || (body as Record<string, unknown>).kind !== "slidedp-host") {
    return { error: 'not a saved host (no "kind": "slidedp-host"): make one on the host with `slidedp topology --save FILE`' };
  }
  return { body };
}

function importForm(onDone: () => void): HTMLElement {
  const status = h("p", { class: "muted", role: "status" });
  const input = h("input", { type: "file", accept: ".json,application/json", "aria-label": "Saved host file" }) as HTMLInputElement;
  input.addEventListener("change", async () => {
    const file = input.files?.[0];
    if (!file) return;
    const read = readSavedHost(await file.text());
    if ("error" in read) {
      replace(status, read.error);
      return;
    }
    try {
      const done = await request<{ name: string }>("POST", `/api/hosts/import?file=${encodeURIComponent(file.name)}`, read.body);
      replace(status, `Imported ${done.name}.`);
      onDone();
    } catch (err) {
      replace(status, errorBox(err, "the import"));
    }
  });
  return h(
    "details",
    { class: "host-import" },
    h("summary", null, "Import a saved host"),
    h("p", null, "Plan for a GPU host from here: on that host run ", h("code", null, "slidedp topology --save host.json"), " and choose the file. It is listed as imported, for plans only."),
    input,
    status,
  );
}

function hostCard(host: Host): HTMLElement {
  const imported = importedOf(host);
  const view = readHost(host.topology ?? {}, host.calibration ?? null);
  const online = imported ? h("span", { class: "badge warn" }, "imported") : host.online === true ? h("span", { class: "badge ok" }, "online") : host.online === false ? h("span", { class: "badge bad" }, "offline") : null;
  const gpuTable = view.gpus.length
    ? h(
        "table",
        { class: "data-table" },
        h("caption", null, "GPUs"),
        h("thead", null, h("tr", null, ["GPU", "Name", "HBM", "PCIe", "NUMA", "H2D measured", "D2H measured"].map((c) => h("th", { scope: "col" }, c)))),
        h(
          "tbody",
          null,
          view.gpus.map((g) =>
            h("tr", null, h("td", null, g.index), h("td", null, g.name ?? "–"), h("td", { class: "num" }, gib(g.hbmGiB)), h("td", null, g.pcie ?? "–"), h("td", null, g.numa ?? "–"), h("td", { class: "num" }, g.h2dGBs === null ? "not measured" : gbps(g.h2dGBs)), h("td", { class: "num" }, g.d2hGBs === null ? "not measured" : gbps(g.d2hGBs))),
          ),
        ),
      )
    : null;
  const linkTable = view.links.length
    ? h(
        "table",
        { class: "data-table" },
        h("caption", null, "GPU links"),
        h("thead", null, h("tr", null, ["GPUs", "Link", "Measured bandwidth", "P2P"].map((c) => h("th", { scope: "col" }, c)))),
        h(
          "tbody",
          null,
          view.links.map((l) => h("tr", null, h("td", null, `${l.a} – ${l.b}`), h("td", null, linkLabel({ ...l, bandwidthGBs: null })), h("td", { class: "num" }, l.bandwidthGBs === null ? "not measured" : gbps(l.bandwidthGBs)), h("td", null, l.p2p === null ? "–" : l.p2p ? "yes" : "no"))),
        ),
      )
    : null;
  return h(
    "article",
    { class: "host card", "aria-label": `Host ${host.name}` },
    h("h2", null, host.name, " ", online),
    imported ? h("p", { class: "imported-note" }, importedNote(imported)) : null,
    facts([
      ["queue", imported ? null : (host.queue ?? null)],
      ["last seen", host.last_seen ? when(host.last_seen) : null],
    ]),
    host.topology ? drawHost(view, host.name) : h("p", { class: "muted" }, "This host has not reported its topology."),
    view.notes.length ? h("ul", { class: "notes" }, view.notes.map((n) => h("li", null, n))) : null,
    h("div", { class: "two-col" }, gpuTable, linkTable),
    calibration(host),
    h("details", { class: "raw" }, h("summary", null, "Raw topology JSON"), h("pre", null, JSON.stringify(host.topology ?? null, null, 2))),
  );
}

export function hostsPage(root: HTMLElement): Cleanup {
  let stopped = false;
  const body = h("div", null, h("p", { class: "muted" }, "Loading…"));
  replace(root, h("div", { class: "page-head" }, h("h1", null, "Hosts")), importForm(() => void load()), body);
  const load = async () => {
    if (await apiAbsent()) {
      replace(body, h("p", { class: "muted" }, "The hosts appear here once the API answers."));
      return;
    }
    try {
      const { items } = await api.hosts();
      if (stopped) return;
      replace(body, items.length ? items.map(hostCard) : h("p", { class: "muted" }, "No worker host has reported yet. Start a worker (make run starts one) and reload."));
      body.querySelector(".cal-planned")?.scrollIntoView({ block: "center" });
    } catch (err) {
      if (!stopped) replace(body, errorBox(err, "the hosts"));
    }
  };
  void load();
  return () => {
    stopped = true;
  };
}
