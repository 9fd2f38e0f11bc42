import { describe, expect, it } from "vitest";
import { reopenDelay, ResumableStream, resumeUrl, type EventSourceLike } from "./sse";

/** A scripted EventSource: the test opens, delivers and breaks connections as a server and network would. */
class ScriptedSource implements EventSourceLike {
  readyState = 0;
  onopen: ((ev: Event) => unknown) | null = null;
  onerror: ((ev: Event) => unknown) | null = null;
  closed = false;
  private listeners = new Map<string, ((ev: MessageEvent) => void)[]>();
  constructor(readonly url: string) {}
  addEventListener(type: string, fn: (ev: MessageEvent) => void) {
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), fn]);
  }
  close() {
    this.closed = true;
    this.readyState = 2;
  }
  open() {
    this.readyState = 1;
    this.onopen?.(new Event("open"));
  }
  emit(type: string, data: unknown, id: string) {
    for (const fn of this.listeners.get(type) ?? []) fn(new MessageEvent(type, { data: JSON.stringify(data), lastEventId: id }));
  }
  failPermanently() {
    this.readyState = 2;
    this.onerror?.(new Event("error"));
  }
  dropAndRetry() {
    this.readyState = 0;
    this.onerror?.(new Event("error"));
  }
}

function harness() {
  const sources: ScriptedSource[] = [];
  const timers: { fn: () => void; ms: number }[] = [];
  const got: { type: string; data: string; id: string }[] = [];
  const states: string[] = [];
  let reopens = 0;
  const stream = new ResumableStream(
    "/api/jobs/7/events",
    {
      onEvent: (type, data, id) => got.push({ type, data, id }),
      onState: (s) => states.push(s),
      onReopen: () => reopens++,
    },
    {
      factory: (url) => {
        const s = new ScriptedSource(url);
        sources.push(s);
        return s;
      },
      schedule: (fn, ms) => timers.push({ fn, ms }),
      cancel: () => undefined,
    },
  );
  return { stream, sources, timers, got, states, reopens: () => reopens };
}

describe("resumeUrl", () => {
  it("adds last_event_id to relative and absolute URLs", () => {
    expect(resumeUrl("/api/jobs/1/events", "42")).toBe("/api/jobs/1/events?last_event_id=42");
    expect(resumeUrl("/api/jobs/1/events?x=1", "42")).toBe("/api/jobs/1/events?x=1&last_event_id=42");
    expect(resumeUrl("http://127.0.0.1:8000/api/jobs/1/events", "9")).toBe("http://127.0.0.1:8000/api/jobs/1/events?last_event_id=9");
    expect(resumeUrl("/api/jobs/1/events", null)).toBe("/api/jobs/1/events");
  });

  it("backs off and holds at the longest delay", () => {
    expect([0, 1, 2, 3, 4, 5, 50].map((a) => reopenDelay(a, [1, 2, 5]))).toEqual([1, 2, 5, 5, 5, 5, 5]);
  });
});

describe("ResumableStream", () => {
  it("reopens a refused stream after the last event it saw and loses nothing", () => {
    const t = harness();
    t.stream.start();
    t.sources[0].open();
    t.sources[0].emit("metrics", { step: 1 }, "10");
    t.sources[0].emit("metrics", { step: 2 }, "11");
    t.sources[0].failPermanently();
    expect(t.stream.state).toBe("reconnecting");
    expect(t.timers).toHaveLength(1);
    t.timers[0].fn();
    expect(t.sources[1].url).toBe("/api/jobs/7/events?last_event_id=11");
    t.sources[1].open();
    expect(t.reopens()).toBe(1);
    t.sources[1].emit("metrics", { step: 3 }, "12");
    expect(t.got.map((g) => JSON.parse(g.data).step)).toEqual([1, 2, 3]);
    expect(t.states).toEqual(["open", "reconnecting", "open"]);
  });

  it("leaves a dropped connection to the browser's own retry (Last-Event-ID) and asks for a catch-up", () => {
    const t = harness();
    t.stream.start();
    t.sources[0].open();
    t.sources[0].emit("log", { seq: 1 }, "3");
    t.sources[0].dropAndRetry();
    expect(t.timers).toHaveLength(0);
    expect(t.sources).toHaveLength(1);
    t.sources[0].open();
    expect(t.reopens()).toBe(1);
    expect(t.stream.state).toBe("open");
  });

  it("does not reconnect after the job ended, and ignores a replaced source", () => {
    const t = harness();
    t.stream.start();
    t.sources[0].open();
    t.stream.end();
    expect(t.sources[0].closed).toBe(true);
    t.sources[0].failPermanently();
    expect(t.timers).toHaveLength(0);
    expect(t.stream.state).toBe("ended");
  });

  it("drop() breaks the connection and reopens with the last id", () => {
    const t = harness();
    t.stream.start();
    t.sources[0].open();
    t.sources[0].emit("status", { status: "running" }, "5");
    t.stream.drop();
    expect(t.sources[0].closed).toBe(true);
    t.timers[0].fn();
    expect(t.sources[1].url).toContain("last_event_id=5");
    // Events from the old connection are not delivered twice.
    t.sources[0].emit("metrics", { step: 99 }, "6");
    expect(t.got).toHaveLength(1);
  });

  it("backs off longer after consecutive refusals and resets after a success", () => {
    const t = harness();
    t.stream.start();
    t.sources[0].failPermanently();
    t.timers[0].fn();
    t.sources[1].failPermanently();
    t.timers[1].fn();
    expect(t.timers[1].ms).toBeGreaterThan(t.timers[0].ms);
    t.sources[2].open();
    t.sources[2].failPermanently();
    expect(t.timers[2].ms).toBe(t.timers[0].ms);
  });
});

/** A stream behind an API token: every open waits for a ticket that the test hands out (or refuses). */
function signedHarness() {
  const sources: ScriptedSource[] = [];
  const timers: { fn: () => void; ms: number }[] = [];
  const got: string[] = [];
  const pending: { url: string; resolve: (u: string) => void; reject: (e: Error) => void }[] = [];
  let reopens = 0;
  let issued = 0;
  const stream = new ResumableStream(
    "/api/jobs/7/events",
    { onEvent: (_t, _d, id) => got.push(id), onReopen: () => reopens++ },
    {
      factory: (url) => {
        const s = new ScriptedSource(url);
        sources.push(s);
        return s;
      },
      sign: (url) =>
        new Promise<string>((resolve, reject) => pending.push({ url, resolve, reject })),
      schedule: (fn, ms) => timers.push({ fn, ms }),
      cancel: () => undefined,
    },
  );
  /** Hand out the next ticket and let the stream open with it. */
  async function grant(): Promise<void> {
    const p = pending.shift();
    if (!p) throw new Error("no ticket was asked for");
    issued++;
    p.resolve(`${p.url}${p.url.includes("?") ? "&" : "?"}ticket=t${issued}`);
    await Promise.resolve();
    await Promise.resolve();
  }
  async function refuse(): Promise<void> {
    const p = pending.shift();
    if (!p) throw new Error("no ticket was asked for");
    p.reject(new Error("503"));
    await Promise.resolve();
    await Promise.resolve();
  }
  return { stream, sources, timers, got, pending, grant, refuse, reopens: () => reopens };
}

describe("ResumableStream with tickets", () => {
  it("opens only with a ticket, and after an error asks for a fresh one and resumes from the last id", async () => {
    const t = signedHarness();
    t.stream.start();
    expect(t.sources).toHaveLength(0); // nothing opens before the ticket
    expect(t.pending.map((p) => p.url)).toEqual(["/api/jobs/7/events"]);
    await t.grant();
    expect(t.sources[0].url).toBe("/api/jobs/7/events?ticket=t1");
    t.sources[0].open();
    t.sources[0].emit("metrics", { step: 1 }, "20");
    t.sources[0].emit("metrics", { step: 2 }, "21");
    // A dropped connection: the browser would retry with the spent ticket; the stream closes it instead.
    t.sources[0].dropAndRetry();
    expect(t.sources[0].closed).toBe(true);
    expect(t.stream.state).toBe("reconnecting");
    expect(t.timers).toHaveLength(1);
    t.timers[0].fn();
    expect(t.pending.map((p) => p.url)).toEqual(["/api/jobs/7/events?last_event_id=21"]);
    await t.grant();
    expect(t.sources[1].url).toBe("/api/jobs/7/events?last_event_id=21&ticket=t2");
    t.sources[1].open();
    expect(t.reopens()).toBe(1);
    t.sources[1].emit("metrics", { step: 3 }, "22");
    expect(t.got).toEqual(["20", "21", "22"]);
  });

  it("a spent ticket refused by the server (CLOSED) gets a new ticket too", async () => {
    const t = signedHarness();
    t.stream.start();
    await t.grant();
    t.sources[0].open();
    t.sources[0].emit("log", { seq: 1 }, "5");
    t.sources[0].failPermanently();
    t.timers[0].fn();
    await t.grant();
    expect(t.sources[1].url).toBe("/api/jobs/7/events?last_event_id=5&ticket=t2");
    expect(new Set(t.sources.map((s) => s.url)).size).toBe(2); // no URL, so no ticket, is used twice
  });

  it("backs off when no ticket can be had, then tries again", async () => {
    const t = signedHarness();
    t.stream.start();
    await t.refuse();
    expect(t.sources).toHaveLength(0);
    expect(t.stream.state).toBe("reconnecting");
    t.timers[0].fn();
    await t.refuse();
    expect(t.timers[1].ms).toBeGreaterThan(t.timers[0].ms);
    t.timers[1].fn();
    await t.grant();
    t.sources[0].open();
    expect(t.stream.state).toBe("open");
  });

  it("a ticket that arrives after the stream was closed opens nothing", async () => {
    const t = signedHarness();
    t.stream.start();
    t.stream.close();
    await t.grant();
    expect(t.sources).toHaveLength(0);
    expect(t.stream.state).toBe("closed");
  });
});
