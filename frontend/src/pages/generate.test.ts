import { describe, expect, it } from "vitest";
import { answerNote, modelSources, statusLine, type Generation } from "./generate";

const base: Generation = {
  id: 4,
  job_id: 2,
  status: "queued",
  url: "/api/jobs/2/generations/4",
  prompt: "3 + 5 =",
  max_new_tokens: 8,
  temperature: 0,
  checkpoint: null,
  host: null,
};

describe("the prompt box", () => {
  it("offers the export of a completed job and every checkpoint by name", () => {
    const ckpts = ["step-00000002", "step-00000004"];
    expect(modelSources({ status: "completed", config: {}, checkpoints: ckpts }).map((s) => s.value)).toEqual(["", ...ckpts]);
    // no export: a job that did not complete, or one run with export: false
    expect(modelSources({ status: "cancelled", config: {}, checkpoints: ckpts }).map((s) => s.value)).toEqual(ckpts);
    expect(modelSources({ status: "completed", config: { export: false }, checkpoints: [] })).toEqual([]);
  });

  it("says which job a waiting prompt is queued behind, then how the answer came", () => {
    const waiting = { ...base, waiting: "waiting for the running job 7 on host gpu1", waiting_for_job: 7 };
    expect(statusLine(waiting)).toBe("Queued behind job 7 on host gpu1: it runs when that job leaves the host.");
    expect(statusLine({ ...base, waiting: "waiting for the worker of host gpu1 to take it" })).toBe(
      "Queued: waiting for the worker of host gpu1 to take it.",
    );
    expect(statusLine({ ...base, status: "running", host: "gpu1" })).toBe("Generating on gpu1…");
    const done = { ...base, status: "done", host: "gpu1", new_tokens: 3, stop: "eos", timings: { generate_s: 0.25, load_s: 1.23, queued_s: 0.2 } };
    expect(statusLine(done)).toBe("Answered on gpu1 (3 tokens, 0.25 s, model loaded in 1.2 s).");
    expect(statusLine({ ...done, stop: "length", timings: { convert_s: 2.04, queued_s: 41 } })).toBe(
      "Answered on gpu1 (3 tokens, checkpoint converted in 2.0 s, queued 41 s); it stopped at max new tokens.",
    );
    expect(statusLine({ ...base, status: "failed", error: "job 2 has no export" })).toBe("Failed: job 2 has no export");
  });
});

describe("an answer that needs a word", () => {
  it("shows the runtime's note, says an empty answer is empty, and says nothing of a whole one", () => {
    const done = { ...base, status: "done", stop: "eos" as const };
    const note = "The model's first token was its end marker: it ended the answer at once, so the answer is empty.";
    expect(answerNote({ ...done, text: "", note })).toBe(note);
    expect(answerNote({ ...done, text: "  " })).toBe("The answer is empty: the model generated nothing printable.");
    expect(answerNote({ ...done, text: "8" })).toBeNull();
    expect(answerNote({ ...base, status: "running", text: "" })).toBeNull();
  });
});
