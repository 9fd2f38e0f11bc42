// Whether the workbench API answers, polled for the whole app; the banner says so in words.
import { api, ApiError, ApiUnreachable, setApiToken } from "./api";
import { h, replace } from "./dom";
import type { Health } from "./types";

export type Reachability =
  | { kind: "unknown" }
  | { kind: "ok"; health: Health }
  | { kind: "unreachable"; message: string }
  | { kind: "error"; message: string };

let current: Reachability = { kind: "unknown" };
const listeners = new Set<(r: Reachability) => void>();
let timer: ReturnType<typeof setTimeout> | null = null;
let first: Promise<Reachability> | null = null;

/** The first health answer: pages wait for it so that an absent API costs one failed request, not one per call. */
export function firstCheck(): Promise<Reachability> {
  if (!first) first = checkHealth();
  return first;
}

/** True when the API is known to be absent or to refuse us for want of a token: pages then leave the banner to
 *  say so instead of calling it, and are drawn again once it answers. */
export async function apiAbsent(): Promise<boolean> {
  await firstCheck();
  return current.kind === "unreachable" || (current.kind === "error" && current.message === "unauthorised");
}

export function reachability(): Reachability {
  return current;
}

export function onReachability(fn: (r: Reachability) => void): () => void {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

export async function checkHealth(): Promise<Reachability> {
  let next: Reachability;
  try {
    next = { kind: "ok", health: await api.health() };
  } catch (err) {
    if (err instanceof ApiUnreachable) next = { kind: "unreachable", message: err.message };
    else if (err instanceof ApiError && err.status === 401) next = { kind: "error", message: "unauthorised" };
    else next = { kind: "error", message: (err as Error).message };
  }
  const wasDown = current.kind !== "ok";
  current = next;
  for (const fn of listeners) fn(next);
  if (timer) clearTimeout(timer);
  // Poll slowly while healthy, faster while down so the page comes back soon after the server does.
  timer = setTimeout(() => void checkHealth(), next.kind === "ok" ? 15000 : 3000);
  if (wasDown && next.kind === "ok") window.dispatchEvent(new CustomEvent("slidedp:api-back"));
  return next;
}

/** Render the banner for the current reachability into `el`. */
export function renderBanner(el: HTMLElement, r: Reachability): void {
  el.hidden = false;
  if (r.kind === "unreachable") {
    el.className = "banner banner-bad";
    replace(
      el,
      h("strong", null, "API unreachable. "),
      `The workbench API at ${location.origin}/api does not answer (${r.message}). `,
      "Start it with ",
      h("code", null, "make run"),
      " and this page reconnects by itself. ",
      h("button", { type: "button", class: "link", onclick: () => void checkHealth() }, "Retry now"),
    );
    return;
  }
  if (r.kind === "error" && r.message === "unauthorised") {
    // The server requires a token (SLIDEDP_API_TOKEN, or one it generated for a non-loopback bind and printed as a
    // login URL): ask for it once and keep it in this browser.
    el.className = "banner banner-warn";
    const input = h("input", { id: "api-token", type: "password", autocomplete: "off" });
    const form = h(
      "form",
      { class: "inline-form" },
      h("label", { for: "api-token" }, "API token"),
      input,
      h("button", { type: "submit" }, "Use token"),
    );
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      setApiToken(input.value.trim() || null);
      void checkHealth().then(() => window.dispatchEvent(new CustomEvent("slidedp:api-back")));
    });
    replace(
      el,
      h("strong", null, "This workbench needs an API token. "),
      "Open the login URL the server printed (…/#token=…), or paste the token: ",
      form,
    );
    return;
  }
  if (r.kind === "error") {
    el.className = "banner banner-bad";
    replace(el, h("strong", null, "API error: "), r.message);
    return;
  }
  if (r.kind === "ok") {
    const hl = r.health;
    const problems: string[] = [];
    if (hl.database === false) problems.push("the database does not answer");
    if (hl.redis === false) problems.push("Redis is down: jobs cannot be submitted, cancelled or followed live");
    if (hl.workers === 0) problems.push("no worker is online: new jobs wait in the queue");
    if (hl.status !== "ok" || problems.length) {
      el.className = "banner banner-warn";
      replace(el, h("strong", null, "Degraded: "), problems.length ? problems.join("; ") : String(hl.status));
      return;
    }
  }
  el.hidden = true;
  el.className = "banner";
  replace(el);
}
