// The workbench UI: app shell, routes, and the API reachability banner.
import "uplot/dist/uPlot.min.css";
import "./style.css";
import { adoptTokenFromLocation } from "./api";
import { h } from "./dom";
import { firstCheck, onReachability, renderBanner } from "./health";
import { comparePage } from "./pages/compare";
import { hostsPage } from "./pages/hosts";
import { jobPage } from "./pages/job";
import { jobsPage } from "./pages/jobs";
import { newJobPage } from "./pages/newjob";
import { render, route, startRouter } from "./router";

// A login URL (`/#token=...`, printed by `slidedp serve`): keep the token, clear it from the address bar.
adoptTokenFromLocation();

route(/^\/jobs\/?$/, "Jobs", jobsPage);
route(/^\/jobs\/new\/?$/, "New job", newJobPage);
route(/^\/jobs\/compare\/?$/, "Compare jobs", comparePage);
route(/^\/jobs\/(\d+)\/?$/, "Job", jobPage);
route(/^\/hosts\/?$/, "Hosts", hostsPage);

const links: [string, string][] = [
  ["/jobs", "Jobs"],
  ["/jobs/new", "New job"],
  ["/hosts", "Hosts"],
];
const nav = h(
  "nav",
  { "aria-label": "Main" },
  links.map(([href, label]) => h("a", { href, "data-nav": href }, label)),
);
const banner = h("div", { id: "banner", class: "banner", role: "status", "aria-live": "polite", hidden: true });
const main = h("main", { id: "page", tabindex: "-1" });
const app = document.getElementById("app") ?? document.body;
app.replaceChildren(
  h("a", { class: "skip", href: "#page", onclick: (e: Event) => { e.preventDefault(); main.focus(); } }, "Skip to content"),
  h("header", { class: "topbar" }, h("a", { class: "brand", href: "/jobs" }, "SlideDP Workbench"), nav),
  banner,
  main,
);

function markNav(path: string): void {
  for (const a of nav.querySelectorAll<HTMLAnchorElement>("a")) {
    const href = a.dataset.nav ?? "";
    const active = href === "/jobs" ? /^\/jobs(\/\d+|\/compare)?\/?$/.test(path) : path.startsWith(href);
    if (active) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

onReachability((r) => renderBanner(banner, r));
window.addEventListener("slidedp:api-back", () => render());
startRouter(main, markNav);
void firstCheck();
