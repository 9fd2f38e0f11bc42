import { describe, expect, it } from "vitest";
import { JobReads, type ReadOutcome } from "./reads";

/** Timers the test fires by hand, and reads (each one a GET of the job) the test answers by hand. */
function harness() {
  const timers = new Map<number, { fn: () => void; ms: number }>();
  let nextHandle = 1;
  const reads: { catchUp: boolean; answer: (o: ReadOutcome) => Promise<void> }[] = [];
  const flush = () => new Promise<void>((resolve) => setTimeout(resolve, 0));
  const loop = new JobReads(
    (catchUp) =>
      new Promise<ReadOutcome>((resolve) => {
        reads.push({
          catchUp,
          answer: async (o) => {
            resolve(o);
            await flush();
          },
        });
      }),
    3000,
    {
      set: (fn, ms) => {
        const handle = nextHandle++;
        timers.set(handle, { fn, ms });
        return handle;
      },
      clear: (handle) => void timers.delete(handle as number),
    },
  );
  /** Fire every armed timer, as the clock passing their time would. */
  const tick = () => {
    const due = [...timers.entries()];
    for (const [handle] of due) timers.delete(handle);
    for (const [, t] of due) t.fn();
  };
  return { loop, timers, reads, tick, flush };
}

describe("the job page's reads of its job", () => {
  it("keeps one timer when the stream asks for a read while the timed one is on its way, and reads nothing after the page is left", async () => {
    const { loop, timers, reads, tick, flush } = harness();
    loop.later();
    tick();
    expect(reads).toHaveLength(1);
    // Status events (a fresh page replays them all) ask for reads while the timed one is on its way.
    void loop.now(true);
    void loop.now(true);
    void loop.now(true);
    let answered = 0;
    while (answered < reads.length) await reads[answered++].answer("again");
    expect(timers.size).toBe(1);
    const before = reads.length;
    // The page is left (or its job is being deleted): whatever was armed, the job is not read again.
    await loop.hold();
    tick();
    tick();
    await flush();
    expect(reads.length).toBe(before);
    expect(timers.size).toBe(0);
  });

  it("reads once more, with the catch-up, right after the read on its way when the stream asked meanwhile", async () => {
    const { loop, reads } = harness();
    void loop.now(false);
    void loop.now(true);
    void loop.now(false);
    expect(reads.map((r) => r.catchUp)).toEqual([false]);
    await reads[0].answer("again");
    expect(reads.map((r) => r.catchUp)).toEqual([false, true]);
    await reads[1].answer("again");
    expect(reads).toHaveLength(2);
  });

  it("lets a delete wait for the read on its way, and resumes reading when the delete failed", async () => {
    const { loop, timers, reads, tick, flush } = harness();
    void loop.now(false);
    let held = false;
    const hold = loop.hold().then(() => (held = true));
    await flush();
    // The read sent before the delete must be answered first: sent after it, it would answer 404.
    expect(held).toBe(false);
    await reads[0].answer("again");
    await hold;
    expect(held).toBe(true);
    expect(timers.size).toBe(0);
    void loop.now(true); // a status event while the delete is on its way reads nothing
    expect(reads).toHaveLength(1);
    loop.resume();
    expect(reads).toHaveLength(2);
    await reads[1].answer("again");
    expect(timers.size).toBe(1);
    tick();
    expect(reads).toHaveLength(3);
    await reads[2].answer("done"); // the job has ended: no more timed reads
    expect(timers.size).toBe(0);
  });
});
