// The live event stream of one job, resumable without gaps.
// EventSource reconnects by itself after a dropped connection and sends Last-Event-ID. When the server
// refuses a reconnect (a 503 while Redis restarts, a proxy error) the browser gives up for good (CLOSED);
// then this class reopens it with ?last_event_id= after a back-off, so no event between is lost.
// Behind an API token every open needs a fresh ticket (`sign`), and the browser's own reconnect would reuse the
// spent one: then any error closes the stream and this class reopens it with a new ticket, from the last id.

export interface EventSourceLike {
  readonly readyState: number;
  onopen: ((ev: Event) => unknown) | null;
  onerror: ((ev: Event) => unknown) | null;
  addEventListener(type: string, listener: (ev: MessageEvent) => void): void;
  close(): void;
}

export type StreamState = "connecting" | "open" | "reconnecting" | "ended" | "closed";

export interface StreamHandlers {
  /** Called with the parsed data of each named event ("metrics", "status", "log"). */
  onEvent(type: string, data: string, id: string): void;
  onState?(state: StreamState): void;
  /** The connection is open again after a break: fetch anything the stream cannot replay. */
  onReopen?(): void;
}

export interface StreamOptions {
  events?: string[];
  /** Turns the URL into the one to open, e.g. by adding a one-time ticket; called for every (re)open. */
  sign?: (url: string) => Promise<string>;
  factory?: (url: string) => EventSourceLike;
  delaysMs?: number[];
  schedule?: (fn: () => void, ms: number) => unknown;
  cancel?: (handle: unknown) => void;
}

const CLOSED = 2;
export const DEFAULT_DELAYS_MS = [500, 1000, 2000, 5000, 10000];

/** The URL that resumes a stream after `lastEventId` (none: from the start the server chooses). */
export function resumeUrl(url: string, lastEventId: string | null): string {
  if (lastEventId === null || lastEventId === "") return url;
  const u = new URL(url, "http://placeholder.invalid");
  u.searchParams.set("last_event_id", lastEventId);
  const rel = u.pathname + u.search;
  return /^https?:/.test(url) ? u.toString() : rel;
}

/** Back-off before the n-th reopen (0-based), holding at the last delay. */
export function reopenDelay(attempt: number, delays: readonly number[] = DEFAULT_DELAYS_MS): number {
  return delays[Math.min(attempt, delays.length - 1)];
}

export class ResumableStream {
  lastEventId: string | null = null;
  state: StreamState = "connecting";
  private source: EventSourceLike | null = null;
  private attempts = 0;
  private timer: unknown = null;
  private hadBreak = false;
  private generation = 0;
  private readonly events: string[];
  private readonly sign: ((url: string) => Promise<string>) | null;
  private readonly factory: (url: string) => EventSourceLike;
  private readonly delays: number[];
  private readonly schedule: (fn: () => void, ms: number) => unknown;
  private readonly cancelTimer: (handle: unknown) => void;

  constructor(
    private readonly url: string,
    private readonly handlers: StreamHandlers,
    opts: StreamOptions = {},
  ) {
    this.events = opts.events ?? ["metrics", "status", "log"];
    this.sign = opts.sign ?? null;
    this.factory = opts.factory ?? ((u) => new EventSource(u) as unknown as EventSourceLike);
    this.delays = opts.delaysMs ?? DEFAULT_DELAYS_MS;
    this.schedule = opts.schedule ?? ((fn, ms) => setTimeout(fn, ms));
    this.cancelTimer = opts.cancel ?? ((h) => clearTimeout(h as ReturnType<typeof setTimeout>));
  }

  start(): void {
    this.open();
  }

  /** The server said the job is over: stop without reconnecting. */
  end(): void {
    this.shutdown("ended");
  }

  /** The page is leaving. */
  close(): void {
    this.shutdown("closed");
  }

  /** Break the connection as a network failure would (used by the reconnect test in a real browser). */
  drop(): void {
    if (!this.source) return;
    this.source.close();
    this.source = null;
    this.broken();
  }

  private open(): void {
    this.timer = null;
    const url = resumeUrl(this.url, this.lastEventId);
    if (!this.sign) {
      this.connect(url);
      return;
    }
    const generation = ++this.generation;
    this.sign(url).then(
      (signed) => {
        if (generation === this.generation && !this.finished()) this.connect(signed);
      },
      () => {
        if (generation === this.generation) this.broken(); // no ticket now (server away): back off, try again
      },
    );
  }

  private finished(): boolean {
    return this.state === "ended" || this.state === "closed";
  }

  private connect(url: string): void {
    const es = this.factory(url);
    this.source = es;
    es.onopen = () => {
      if (this.source !== es) return;
      this.attempts = 0;
      this.setState("open");
      if (this.hadBreak) {
        this.hadBreak = false;
        this.handlers.onReopen?.();
      }
    };
    es.onerror = () => {
      if (this.source !== es) return;
      // With tickets the browser's own retry would present a spent one: reopen with a fresh one instead.
      if (es.readyState === CLOSED || this.sign) {
        es.close();
        this.source = null;
        this.broken();
      } else {
        // The browser retries by itself, sending Last-Event-ID.
        this.hadBreak = true;
        this.setState("reconnecting");
      }
    };
    for (const type of this.events) {
      es.addEventListener(type, (ev: MessageEvent) => {
        if (this.source !== es) return;
        if (ev.lastEventId) this.lastEventId = ev.lastEventId;
        this.handlers.onEvent(type, String(ev.data), ev.lastEventId);
      });
    }
  }

  private broken(): void {
    if (this.finished()) return;
    this.hadBreak = true;
    this.setState("reconnecting");
    const delay = reopenDelay(this.attempts++, this.delays);
    this.timer = this.schedule(() => this.open(), delay);
  }

  private shutdown(state: StreamState): void {
    this.generation++; // a ticket still on its way opens nothing
    if (this.timer !== null) this.cancelTimer(this.timer);
    this.timer = null;
    this.source?.close();
    this.source = null;
    this.setState(state);
  }

  private setState(state: StreamState): void {
    if (this.state === state) return;
    this.state = state;
    this.handlers.onState?.(state);
  }
}
