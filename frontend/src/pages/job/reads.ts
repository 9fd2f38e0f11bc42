// The job page's reads of its job: one every few seconds while it runs, one more right away when the stream says its
// status changed, none while the page deletes it and none once the page is left.
// One read at a time and one timer at most. Reads that overlapped (a fresh page replays every status event of the
// job, each asking for a read) each armed the next one, and the page kept only the last timer: the others outlived
// the page and read the job after it was left, and after a delete from the jobs list that answered 404.

export interface Timers {
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const TIMERS: Timers = { set: (fn, ms) => setTimeout(fn, ms), clear: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>) };

/** What a read says of the next one: "again" in a few seconds, or "done" (the job ended, or is gone). */
export type ReadOutcome = "again" | "done";

export class JobReads {
  private timer: unknown = null;
  private inFlight: Promise<void> | null = null;
  /** A read asked for while one was on its way: it follows that one, with the catch-up if any asker wanted it. */
  private queued: { catchUp: boolean } | null = null;
  private held = false;

  /** `read` reads the job (with the metrics and log lines the stream may have missed when `catchUp`). */
  constructor(
    private readonly read: (catchUp: boolean) => Promise<ReadOutcome>,
    private readonly everyMs: number,
    private readonly timers: Timers = TIMERS,
  ) {}

  /** Read now, or right after the read on its way; resolves when the job has been read. */
  now(catchUp = false): Promise<void> {
    if (this.held) return Promise.resolve();
    this.disarm();
    if (this.inFlight) {
      this.queued = { catchUp: catchUp || (this.queued?.catchUp ?? false) };
      return this.inFlight;
    }
    this.inFlight = this.run(catchUp);
    return this.inFlight;
  }

  /** The next read in a few seconds. */
  later(): void {
    if (!this.held && !this.inFlight) this.arm();
  }

  /** No read from now on (the page is left, or deletes the job); resolves once the read on its way has answered,
   *  so that a delete sent then cannot overtake it. */
  async hold(): Promise<void> {
    this.held = true;
    this.queued = null;
    this.disarm();
    await this.inFlight;
  }

  /** Reading again after a hold (the delete failed). */
  resume(): void {
    this.held = false;
    void this.now(true);
  }

  private async run(catchUp: boolean): Promise<void> {
    let outcome: ReadOutcome = "done";
    let next: { catchUp: boolean } | null = { catchUp };
    try {
      while (next && !this.held) {
        this.queued = null;
        outcome = await this.read(next.catchUp);
        next = this.queued;
      }
    } finally {
      this.inFlight = null;
      this.queued = null;
    }
    if (outcome === "again") this.arm();
  }

  private arm(): void {
    this.disarm();
    if (!this.held) this.timer = this.timers.set(() => {
      this.timer = null;
      void this.now();
    }, this.everyMs);
  }

  private disarm(): void {
    if (this.timer !== null) this.timers.clear(this.timer);
    this.timer = null;
  }
}
