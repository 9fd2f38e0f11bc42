import { describe, expect, it } from "vitest";
import { DEFAULT_VIEW, stepTimeChart } from "./charts";
import { CHART_TERMS, explain, explainLabel, explainPhase, explainValue, glossaryEntries, keyOf, PHASE_TERMS, POLICY_TERMS, STAGE_TERMS } from "./glossary";
import { PHASE_KINDS, PHASE_ORDER } from "./series";

// The runtime's own sources, where the names are made: a new phase or policy value fails here until it is explained.
import costModelPy from "../../runtime/slidedp/planning/cost_model.py?raw";
import policyPy from "../../runtime/slidedp/policy.py?raw";
import rankPy from "../../runtime/slidedp/step/rank.py?raw";
import startupPy from "../../runtime/slidedp/startup.py?raw";
import jobProcessPy from "../../backend/slidedp_web/job_process.py?raw";

const SOURCES: Record<string, string> = {
  "step/rank.py": rankPy,
  "planning/cost_model.py": costModelPy,
  "policy.py": policyPy,
  "startup.py": startupPy,
};
const source = (path: string) => SOURCES[path];

/** The keys of the `"phases": {...}` dict literal the runtime writes into every metrics record. */
function measuredPhases(): string[] {
  const m = /"phases":\s*\{([^}]*)\}/.exec(source("step/rank.py"));
  if (!m) throw new Error('runtime/slidedp/step/rank.py no longer writes "phases": {...} as one dict literal: read the phase names where it does');
  return [...m[1].matchAll(/"(\w+)":/g)].map((x) => x[1]);
}

/** A tuple of names in a Python source: NAME = ("a", "b"). */
function pyTuple(path: string, name: string): string[] {
  const m = new RegExp(`^${name}\\s*=\\s*\\(([^)]*)\\)`, "m").exec(source(path));
  if (!m) throw new Error(`${name} not found in runtime/slidedp/${path}`);
  return [...m[1].matchAll(/"(\w+)"/g)].map((x) => x[1]);
}

describe("glossary", () => {
  it("explains every phase the runtime measures and the cost model predicts", () => {
    const measured = measuredPhases();
    expect(measured).toContain("forward");
    const predicted = pyTuple("planning/cost_model.py", "PHASES");
    for (const p of [...measured, ...predicted]) expect(PHASE_TERMS[p], p).toBeDefined();
  });

  it("explains every phase key the step-time chart can draw, by its own entry", () => {
    const phases = Object.fromEntries([...measuredPhases(), ...PHASE_ORDER, ...Object.keys(PHASE_KINDS)].map((p) => [p, 0.1]));
    const rec = { step: 1, step_time_s: 1, phases, predicted: { step_time_s: 1, forward_span: 0.3 } };
    const lay = stepTimeChart.layout([rec], DEFAULT_VIEW, { job: null });
    for (const p of Object.keys(phases)) {
      const line = lay.lines.find((l) => l.get(rec) === 0.1 && keyOf(l.label) === p);
      expect(line, p).toBeDefined();
      expect(line?.hint, p).toBe(PHASE_TERMS[p].text);
    }
    for (const l of lay.lines) expect(l.hint, l.label).toBeTruthy();
  });

  it("explains every start-up stage the runtime and the job process report", () => {
    const words = /^WORDS\s*=\s*\{([\s\S]*?)^\}/m.exec(source("startup.py"));
    expect(words, "WORDS in runtime/slidedp/startup.py").not.toBeNull();
    const stages = [...(words?.[1] ?? "").matchAll(/^\s*"(\w+)":/gm)].map((x) => x[1]);
    expect(stages).toContain("planning");
    expect(stages).toContain("first_step");
    // the job process's own stage, before the runtime is loaded, and the one that ends the start
    const own = [...jobProcessPy.matchAll(/record_stage\([^)]*\{"stage":\s*"(\w+)"/g)].map((x) => x[1]);
    expect(own).toContain("preparing");
    for (const s of [...stages, ...own, "training", "queued"]) {
      expect(STAGE_TERMS[s], s).toBeDefined();
      expect(STAGE_TERMS[s].text).toMatch(/\.$/);
    }
  });

  it("still says something for a phase it does not know", () => {
    expect(explainPhase("new_phase")).toContain("new_phase");
  });

  it("explains every key and value of an execution policy", () => {
    const cls = /class ExecutionPolicy:[\s\S]*?\n\n([\s\S]*?)\n\s*def /.exec(source("policy.py"));
    expect(cls, "ExecutionPolicy in runtime/slidedp/policy.py").not.toBeNull();
    const fields = [...(cls?.[1] ?? "").matchAll(/^\s{4}(\w+):/gm)].map((x) => x[1]);
    expect(fields).toContain("delivery");
    for (const f of [...fields, "staging_slots"]) expect(POLICY_TERMS[f], f).toBeDefined();
    const values: [string, string][] = [
      ...pyTuple("policy.py", "DELIVERIES").map((v): [string, string] => ["delivery", v]),
      ...pyTuple("policy.py", "GRAD_REDUCES").map((v): [string, string] => ["grad_reduce", v]),
      ...pyTuple("policy.py", "DELIVERY_CASTS").map((v): [string, string] => ["delivery_cast", v]),
      ...pyTuple("policy.py", "EDGE_UPDATES").map((v): [string, string] => ["edge_update", v]),
      ...pyTuple("policy.py", "ACTIVATION_POLICIES").map((v): [string, string] => ["activations", v]),
    ];
    for (const [k, v] of values) expect(POLICY_TERMS[`${k}.${v}`], `${k}.${v}`).toBeDefined();
  });

  it("reads labels as the pages show them", () => {
    expect(keyOf("grad reduce")).toBe("grad_reduce");
    expect(keyOf("update busy (overlapped)")).toBe("update_busy");
    expect(keyOf("tokens/s")).toBe("tokens_per_s");
    expect(explainLabel("hbm budget gib")).toBe(POLICY_TERMS.hbm_budget.text);
    expect(explainLabel("step time")).toBe(CHART_TERMS.step_time.text);
    expect(explain("nothing such")).toBeUndefined();
  });

  it("explains a per-layer run of policy values by each value once", () => {
    const text = explainValue("activations", "keep ×23, checkpoint ×13") ?? "";
    expect(text.split("\n")).toEqual([`keep: ${POLICY_TERMS["activations.keep"].text}`, `checkpoint: ${POLICY_TERMS["activations.checkpoint"].text}`]);
    expect(explainValue("delivery", "sharded")).toBe(`sharded: ${POLICY_TERMS["delivery.sharded"].text}`);
    expect(explainValue("window", "3")).toBeUndefined();
  });

  it("lists every entry with a label and a sentence", () => {
    const all = glossaryEntries();
    expect(all.length).toBe(
      Object.keys(PHASE_TERMS).length + Object.keys(CHART_TERMS).length + Object.keys(POLICY_TERMS).length + Object.keys(STAGE_TERMS).length,
    );
    for (const [label, text] of all) {
      expect(label.length).toBeGreaterThan(0);
      expect(text).toMatch(/\.$/);
    }
    expect(all).toContainEqual(["delivery: sharded", POLICY_TERMS["delivery.sharded"].text]);
  });
});
