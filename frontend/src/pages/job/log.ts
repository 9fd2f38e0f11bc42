// The job page's log panel: the last lines of the job's log, and reading the lines after a sequence number.
import { api } from "../../api";
import { h } from "../../dom";
import type { LogLine } from "../../types";

export const LOG_TAIL = 500;

/** The last lines of a job's log, unique by sequence number. */
export class LogTail {
  readonly el = h("pre", { class: "log", tabindex: "0", "aria-label": "Log tail" });
  private lines: LogLine[] = [];
  private pending = false;
  // Follow the newest line unless the reader scrolled up to read something.
  private stick = true;
  constructor() {
    this.el.addEventListener("scroll", () => {
      this.stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 8;
    });
    new ResizeObserver(() => this.follow()).observe(this.el);
  }
  private follow(): void {
    if (this.stick) this.el.scrollTop = this.el.scrollHeight;
  }
  get lastSeq(): number {
    return this.lines.length ? this.lines[this.lines.length - 1].seq : 0;
  }
  add(items: LogLine[]): void {
    let changed = false;
    for (const l of items) {
      if (!l || typeof l.seq !== "number") continue;
      if (this.lines.length === 0 || l.seq > this.lastSeq) this.lines.push(l);
      else if (!this.lines.some((x) => x.seq === l.seq)) {
        this.lines.push(l);
        this.lines.sort((a, b) => a.seq - b.seq);
      } else continue;
      changed = true;
    }
    if (this.lines.length > LOG_TAIL) this.lines.splice(0, this.lines.length - LOG_TAIL);
    if (changed && !this.pending) {
      this.pending = true;
      requestAnimationFrame(() => this.render());
    }
  }
  private render(): void {
    this.pending = false;
    this.el.textContent = this.lines.map((l) => l.line).join("\n");
    this.follow();
  }
}

/** The job's log lines after `afterSeq`, read page by page. */
export async function allLogs(id: number, afterSeq: number): Promise<LogLine[]> {
  const out: LogLine[] = [];
  let cursor = afterSeq;
  // The server may page its answer; read until it has nothing newer (bounded, the tail is what is shown).
  for (let page = 0; page < 200; page++) {
    const { items } = await api.logs(id, cursor);
    if (!items || items.length === 0) break;
    out.push(...items);
    const last = items[items.length - 1].seq;
    if (!(last > cursor)) break;
    cursor = last;
    if (out.length > 20 * LOG_TAIL) out.splice(0, out.length - LOG_TAIL);
  }
  return out;
}
