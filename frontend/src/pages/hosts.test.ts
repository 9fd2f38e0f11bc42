import { describe, expect, it } from "vitest";
import { importedNote, importedOf, readSavedHost } from "./hosts";

describe("imported hosts", () => {
  it("reads the import marker and says the host is planned for but never runs a job", () => {
    const host = { name: "imported:gpu1", topology: { gpus: [], imported: { name: "gpu1", file: "gpu1.json", saved_at: "2026-11-29T10:00:00+00:00" } } };
    const imp = importedOf(host);
    expect(imp).toEqual({ name: "gpu1", file: "gpu1.json", savedAt: "2026-11-29T10:00:00+00:00" });
    expect(importedNote(imp!)).toContain("Imported from gpu1.json, saved 2026-11-29.");
    expect(importedNote(imp!)).toContain("never receives jobs: no worker runs here");
    expect(importedOf({ name: "gpu1", topology: { gpus: [] } })).toBeNull();
  });

  it("sends a saved host and refuses other files before sending them", () => {
    const saved = { kind: "slidedp-host", schema: 1, name: "gpu1" };
    expect(readSavedHost(JSON.stringify(saved))).toEqual({ body: saved });
    expect(readSavedHost("{oops")).toEqual({ error: expect.stringContaining("not JSON") });
    expect(readSavedHost(JSON.stringify({ gpus: [] }))).toEqual({ error: expect.stringContaining("slidedp topology --save") });
  });
});
