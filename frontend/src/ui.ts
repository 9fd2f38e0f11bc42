// Small widgets shared by the pages: status badge, progress bar, error box, two-click confirm.
import { ApiError, ApiUnreachable } from "./api";
import { h } from "./dom";
import { num } from "./fmt";

export function statusBadge(status: string): HTMLSpanElement {
  return h("span", { class: `badge status-${status}`, "data-status": status }, status);
}

export function progress(step: number, steps: number): HTMLElement {
  const frac = steps > 0 ? Math.min(1, Math.max(0, step / steps)) : 0;
  return h(
    "div",
    { class: "progress", title: `${step} of ${steps} steps` },
    h("progress", { max: steps > 0 ? steps : 1, value: steps > 0 ? Math.min(step, steps) : 0, "aria-label": "steps done" }),
    h("span", { class: "progress-label" }, `${step} / ${steps}`, steps > 0 ? ` (${num(frac * 100, 3)} %)` : ""),
  );
}

/** An error as a visible box; the API being away is said differently from a refused request. */
export function errorBox(err: unknown, what: string): HTMLElement {
  if (err instanceof ApiUnreachable) {
    return h("div", { class: "error-box", role: "alert" }, h("strong", null, `Cannot load ${what}: `), "the API is unreachable.");
  }
  const msg = err instanceof ApiError ? `${err.message} (HTTP ${err.status})` : String((err as Error)?.message ?? err);
  return h("div", { class: "error-box", role: "alert" }, h("strong", null, `Cannot load ${what}: `), msg);
}

/** A button that asks to be pressed twice for destructive actions (no modal dialogs). */
export function confirmButton(label: string, confirmLabel: string, action: () => Promise<void> | void, cls = "danger"): HTMLButtonElement {
  let armed = false;
  let timer: ReturnType<typeof setTimeout> | null = null;
  const btn = h("button", { type: "button", class: cls }, label);
  btn.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      btn.textContent = confirmLabel;
      btn.classList.add("armed");
      timer = setTimeout(() => {
        armed = false;
        btn.textContent = label;
        btn.classList.remove("armed");
      }, 5000);
      return;
    }
    if (timer) clearTimeout(timer);
    armed = false;
    btn.disabled = true;
    try {
      await action();
    } finally {
      btn.disabled = false;
      btn.textContent = label;
      btn.classList.remove("armed");
    }
  });
  return btn;
}

/** Run an action from a button, showing its failure next to it instead of in the console. */
export async function runAction(btn: HTMLButtonElement, out: HTMLElement, fn: () => Promise<unknown>): Promise<boolean> {
  btn.disabled = true;
  out.textContent = "";
  try {
    await fn();
    return true;
  } catch (err) {
    out.className = "action-error";
    out.textContent = err instanceof ApiError ? err.message : String((err as Error).message ?? err);
    return false;
  } finally {
    btn.disabled = false;
  }
}
