// "What a different card would buy": the plan's card sweep (docs/interfaces.md §5, `card_sweep`) as a small table,
// one row per memory size per GPU — the best plan AutoPolicy finds with that much memory on each GPU, everything else
// as configured — with the job's own row marked. Read from the plan JSON only.
import { h } from "../dom";
import { isNum } from "../fmt";
import type { CardSweepRow, Plan } from "../types";
import { gibs, pct, secs, tokensPerS } from "./glance";
import "./cardsweep.css";

export interface CardSweepLine {
  size: string; // "80 GiB", "140.4 GiB (whole card)"
  step: string; // "2.84 s" or "–"
  tokens: string; // "11,527 tokens/s" or "–"
  vsCurrent: string | null; // "0.5% faster than this job", null on the job's own row or without times
  fits: boolean;
  detail: string; // the policy in a few words, or why that size cannot hold the job
  current: boolean;
}

/** A memory size as the table says it: whole numbers without decimals. */
function sizeWords(r: CardSweepRow): string {
  const size = Number.isInteger(r.hbm_gib) ? `${r.hbm_gib} GiB` : gibs(r.hbm_gib);
  return r.whole_card ? `${size} (whole card)` : size;
}

/** The table's lines, smallest memory first, as the plan lists them; [] when the plan has no sweep. */
export function cardSweepLines(plan: Pick<Plan, "card_sweep"> | null | undefined): CardSweepLine[] {
  const rows = plan?.card_sweep ?? [];
  const own = rows.find((r) => r.current);
  const ownT = own && isNum(own.step_time_s) ? own.step_time_s : null;
  return rows.map((r) => {
    const t = isNum(r.step_time_s) ? r.step_time_s : null;
    let vs: string | null = null;
    if (!r.current && t !== null && ownT !== null) {
      const d = (t - ownT) / ownT;
      vs = Math.abs(d) < 5e-5 ? "as fast as this job" : d < 0 ? `${pct(-d)} faster than this job` : `${pct(d)} slower than this job`;
    }
    return {
      size: sizeWords(r),
      step: t === null ? "–" : secs(t),
      tokens: isNum(r.tokens_per_s) ? tokensPerS(r.tokens_per_s) : "–",
      vsCurrent: vs,
      fits: r.fits,
      detail: r.fits ? (r.policy ?? "") : (r.why_not ?? "does not fit"),
      current: r.current,
    };
  });
}

export function renderCardSweep(plan: Plan): HTMLElement | null {
  const lines = cardSweepLines(plan);
  if (!lines.length) return null;
  const timed = lines.some((l) => l.step !== "–");
  const body = h(
    "tbody",
    null,
    lines.map((l) =>
      h(
        "tr",
        { class: ["sweep-row", l.current ? "current-row" : "", l.fits ? "" : "rejected-row"].filter(Boolean).join(" "), "data-current": String(l.current) },
        h("td", null, l.size, l.current ? h("strong", { class: "sweep-current" }, " — this job") : null),
        h("td", { class: "num" }, l.step, l.vsCurrent ? h("div", { class: "sweep-vs" }, l.vsCurrent) : null),
        h("td", { class: "num" }, l.tokens),
        h("td", null, l.fits ? "yes" : "no"),
        h("td", { class: l.fits ? "sweep-policy" : "sweep-why" }, l.detail),
      ),
    ),
  );
  return h(
    "div",
    { class: "plan-card-sweep", "data-part": "card-sweep" },
    h(
      "p",
      { class: "muted" },
      `The best plan AutoPolicy finds for this job with that much memory on each GPU, everything else the same (each size planned as a gpu_memory_gib cap on this card).${timed ? "" : " Without a calibration only the memory fit is known."}`,
    ),
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "data-table card-sweep-table" },
        h("thead", null, h("tr", null, ...["GPU memory per GPU", "step", "tokens/s", "fits", "policy"].map((c) => h("th", { scope: "col" }, c)))),
        body,
      ),
    ),
  );
}
