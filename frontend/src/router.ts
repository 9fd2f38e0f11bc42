// Path routing with the History API; FastAPI answers every non-/api path with index.html.

export type Cleanup = () => void;
export type Page = (root: HTMLElement, params: string[]) => Cleanup | void;

interface Route {
  pattern: RegExp;
  page: Page;
  title: string;
}

const routes: Route[] = [];
let root: HTMLElement | null = null;
let cleanup: Cleanup | null = null;
let onRoute: ((path: string) => void) | null = null;

export function route(pattern: RegExp, title: string, page: Page): void {
  routes.push({ pattern, page, title });
}

export function startRouter(el: HTMLElement, afterRoute: (path: string) => void): void {
  root = el;
  onRoute = afterRoute;
  window.addEventListener("popstate", () => render());
  // Same-origin links navigate inside the app; downloads, new tabs and /api links are left to the browser.
  document.addEventListener("click", (ev) => {
    const a = (ev.target as Element | null)?.closest?.("a");
    if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    const href = a.getAttribute("href");
    if (!href || !href.startsWith("/") || href.startsWith("/api") || a.hasAttribute("download") || a.target) return;
    ev.preventDefault();
    navigate(href);
  });
  render();
}

export function navigate(path: string, replaceState = false): void {
  if (replaceState) history.replaceState(null, "", path);
  else if (path !== location.pathname + location.search) history.pushState(null, "", path);
  render();
}

/** Re-mount the current page (after the API comes back). */
export function render(): void {
  if (!root) return;
  let path = location.pathname.replace(/\/index\.html$/, "/");
  if (path === "/" || path === "") {
    history.replaceState(null, "", "/jobs");
    path = "/jobs";
  }
  if (cleanup) {
    try {
      cleanup();
    } finally {
      cleanup = null;
    }
  }
  root.replaceChildren();
  for (const r of routes) {
    const m = r.pattern.exec(path);
    if (m) {
      document.title = `${r.title} · SlideDP Workbench`;
      cleanup = r.page(root, m.slice(1)) || null;
      onRoute?.(path);
      return;
    }
  }
  document.title = "Not found · SlideDP Workbench";
  const p = document.createElement("p");
  p.textContent = `No page at ${path}.`;
  root.append(p);
  onRoute?.(path);
}
