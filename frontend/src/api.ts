// The REST client of the workbench API (same origin, everything under /api; contract in docs/interfaces.md §6).
import { parseJson } from "./json";
import type { Checkpoint, FieldErrorItem, Health, Host, Job, LogLine, MetricsRecord, Plan, Preset, ProfileSummary, TrackerInfo } from "./types";

const TOKEN_KEY = "slidedp.apiToken";

/** The server answered, but not with success: status, its detail, and field errors when it named config keys. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly fieldErrors: FieldErrorItem[] = [],
    readonly detail: unknown = null,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** Nothing that speaks the workbench API answered at this origin (server down, or a plain static server). */
export class ApiUnreachable extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ApiUnreachable";
  }
}

export function apiToken(): string | null {
  try {
    return localStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function setApiToken(token: string | null): void {
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else localStorage.removeItem(TOKEN_KEY);
}

/** The token of a login URL (`http://host:port/#token=...`, printed by `slidedp serve`) and the fragment without
 *  it. The token rides in the fragment because a browser never sends that to a server, so no log records it. */
export function tokenFromHash(hash: string): { token: string | null; rest: string } {
  const raw = hash.replace(/^#/, "");
  if (!raw) return { token: null, rest: "" };
  const params = new URLSearchParams(raw);
  const token = params.get("token");
  if (token === null) return { token: null, rest: hash };
  params.delete("token");
  const rest = params.toString();
  return { token: token.trim() || null, rest: rest ? `#${rest}` : "" };
}

/** On load: keep a login URL's token as this browser's API token and take it out of the address bar (and so out
 *  of the history and of anything copied from there). */
export function adoptTokenFromLocation(loc: Location = location, hist: History = history): boolean {
  const { token, rest } = tokenFromHash(loc.hash);
  if (token === null) return false;
  setApiToken(token);
  hist.replaceState(hist.state, "", loc.pathname + loc.search + rest);
  return true;
}

/** A one-time ticket for one GET of one path (POST /api/tickets). */
export interface Ticket {
  ticket: string;
  path: string;
  expires_at: string;
  expires_in_s: number;
}

/** `url` opened by something that cannot send the bearer header (an EventSource, a download link): with a token,
 *  plus `ticket=` for its path (the token itself never goes into a URL); without one, as it is. */
export async function withTicket(
  url: string,
  token: string | null = apiToken(),
  issue: (path: string) => Promise<Ticket> = (path) => api.ticket(path),
): Promise<string> {
  if (!token) return url;
  const q = url.indexOf("?");
  const path = q < 0 ? url : url.slice(0, q);
  const { ticket } = await issue(path);
  return `${url}${q < 0 ? "?" : "&"}ticket=${encodeURIComponent(ticket)}`;
}

/** Start a download of `path` (the export): a plain link without a token; with one, a link with a fresh ticket. */
export async function download(path: string, doc: Document = document): Promise<void> {
  const a = doc.createElement("a");
  a.href = await withTicket(path);
  a.download = "";
  a.hidden = true;
  doc.body.append(a);
  try {
    a.click();
  } finally {
    a.remove();
  }
}

/** A validation `loc` as a config key path: ["body", "optimizer", "betas", 0] -> "optimizer.betas[0]". */
export function locToPath(loc: unknown): string {
  if (typeof loc === "string") return loc.replace(/^body\.?/, "");
  if (!Array.isArray(loc)) return "";
  const parts = loc[0] === "body" ? loc.slice(1) : loc;
  let path = "";
  for (const p of parts) {
    if (typeof p === "number") path += `[${p}]`;
    else path += (path ? "." : "") + String(p);
  }
  return path;
}

/** Field errors out of a 422 body: FastAPI's {"detail": [{loc, msg}]} or {"detail": {"errors": [...]}}. */
export function fieldErrorsOf(body: unknown): FieldErrorItem[] {
  const detail = (body as { detail?: unknown } | null)?.detail ?? body;
  const list = Array.isArray(detail)
    ? detail
    : Array.isArray((detail as { errors?: unknown } | null)?.errors)
      ? (detail as { errors: unknown[] }).errors
      : [];
  const out: FieldErrorItem[] = [];
  for (const item of list) {
    if (item && typeof item === "object" && "msg" in item) {
      const it = item as { loc?: unknown; msg: unknown };
      out.push({ loc: locToPath(it.loc), msg: String(it.msg) });
    }
  }
  return out;
}

function describeDetail(status: number, body: unknown, fallback: string): string {
  const detail = (body as { detail?: unknown } | null)?.detail;
  if (typeof detail === "string") return detail;
  const errs = fieldErrorsOf(body);
  if (errs.length) return errs.map((e) => (e.loc ? `${e.loc}: ${e.msg}` : e.msg)).join("; ");
  return `${status} ${fallback}`.trim();
}

export async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const token = apiToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  let resp: Response;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    throw new ApiUnreachable(`no answer from ${location.origin}${path}: ${(err as Error).message}`);
  }
  const text = await resp.text();
  const isJson = (resp.headers.get("content-type") || "").includes("json");
  let parsed: unknown = null;
  if (text && isJson) {
    try {
      parsed = parseJson(text);
    } catch {
      throw new ApiError(resp.status, `unreadable JSON from ${path}`);
    }
  }
  if (resp.ok) return parsed as T;
  // A proxy's gateway error or a static server's HTML 404 means the API itself is not there.
  if (!isJson && [404, 405, 501, 502, 503, 504].includes(resp.status)) {
    throw new ApiUnreachable(`${location.origin}${path} answered ${resp.status} without the workbench API`);
  }
  const message = describeDetail(resp.status, parsed, resp.statusText);
  throw new ApiError(resp.status, message, resp.status === 422 ? fieldErrorsOf(parsed) : [], parsed);
}

export const api = {
  health: () => request<Health>("GET", "/api/health"),
  presets: () => request<{ items: Preset[]; trackers?: TrackerInfo[] }>("GET", "/api/presets"),
  hosts: () => request<{ items: Host[] }>("GET", "/api/hosts"),
  plan: (config: Record<string, unknown>) => request<Plan>("POST", "/api/plan", config),
  profiles: () => request<{ items: ProfileSummary[] }>("GET", "/api/profiles"),
  listJobs: (q: { status?: string; limit?: number; offset?: number } = {}) => {
    const params = new URLSearchParams();
    if (q.status) params.set("status", q.status);
    if (q.limit !== undefined) params.set("limit", String(q.limit));
    if (q.offset !== undefined) params.set("offset", String(q.offset));
    const qs = params.toString();
    return request<{ items: Job[]; total: number }>("GET", `/api/jobs${qs ? "?" + qs : ""}`);
  },
  createJob: (body: Record<string, unknown>) => request<Job>("POST", "/api/jobs", body),
  job: (id: number) => request<Job>("GET", `/api/jobs/${id}`),
  cancel: (id: number, save: boolean) => request<Job>("POST", `/api/jobs/${id}/cancel`, { save }),
  resume: (id: number) => request<Job>("POST", `/api/jobs/${id}/resume`),
  remove: (id: number) => request<null>("DELETE", `/api/jobs/${id}`),
  metrics: (id: number, afterStep: number, limit: number) =>
    request<{ items: MetricsRecord[] }>("GET", `/api/jobs/${id}/metrics?after_step=${afterStep}&limit=${limit}`),
  logs: (id: number, afterSeq: number) =>
    request<{ items: LogLine[] }>("GET", `/api/jobs/${id}/logs?after_seq=${afterSeq}`),
  checkpoints: (id: number) => request<{ items: Checkpoint[] }>("GET", `/api/jobs/${id}/checkpoints`),
  ticket: (path: string) => request<Ticket>("POST", "/api/tickets", { path }),
  // Opened without the bearer header: with a token they need a ticket (withTicket), which a URL never holds.
  eventsUrl: (id: number) => `/api/jobs/${id}/events`,
  exportUrl: (id: number) => `/api/jobs/${id}/export`,
  openapi: () => request<Record<string, unknown>>("GET", "/openapi.json"),
};

/** Every stored metrics record after `afterStep`, page by page until a page comes back empty: the server may
 *  answer fewer rows than asked for (it caps pages), so a short page does not mean the end. */
export async function allMetrics(id: number, afterStep = 0, pageSize = 5000): Promise<MetricsRecord[]> {
  const out: MetricsRecord[] = [];
  let cursor = afterStep;
  for (;;) {
    const { items } = await api.metrics(id, cursor, pageSize);
    if (!items || items.length === 0) break;
    out.push(...items);
    const last = items[items.length - 1].step;
    if (!(last > cursor)) break;
    cursor = last;
  }
  return out;
}
