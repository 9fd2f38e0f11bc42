import { describe, expect, it } from "vitest";
import { checkedTrackers, fieldLabel, GROUPS, reportToValue } from "./jobform";

describe("the job form in words", () => {
  it("gives the keys the old Other section showed raw a section and a plain label", () => {
    const sectionOf = (path: string) => GROUPS.find((g) => g.slots.some((x) => x.path === path))?.title;
    expect(sectionOf("eval.holdout")).toBe("Evaluation");
    expect(sectionOf("health.on_warning")).toBe("Health checks");
    expect(sectionOf("report_to")).toBe("Experiment trackers");
    expect(sectionOf("init_from.checkpoint")).toBe("Start from an earlier run");
    expect(sectionOf("gpu_memory_gib")).toBe("Hardware");
    expect(fieldLabel("eval.holdout")).toBe("Held-out share of the training data");
    expect(fieldLabel("health.on_warning")).toBe("When a check warns");
    expect(fieldLabel("optimizer.lr")).toBe("Learning rate");
    // a key the layout does not know yet still reads as words
    expect(fieldLabel("data.max_rows")).toBe("data: max rows");
    for (const g of GROUPS) for (const slot of g.slots) expect(slot.label).not.toMatch(/^[a-z_]+(\.[a-z_]+)+$/);
    const paths = GROUPS.flatMap((g) => g.slots.map((x) => x.path));
    expect(new Set(paths).size).toBe(paths.length); // each key in one section
  });

  it("sends report_to as the free-text field did: left out for the default, the ticked names otherwise", () => {
    expect(reportToValue(["tensorboard"])).toBeUndefined();
    expect(reportToValue(["mlflow", "tensorboard"])).toEqual(["tensorboard", "mlflow"]);
    expect(reportToValue(["wandb"])).toEqual(["wandb"]);
    expect(reportToValue([])).toEqual(["none"]);
    expect(checkedTrackers(undefined)).toEqual(["tensorboard"]);
    expect(checkedTrackers(null)).toEqual(["tensorboard"]);
    expect(checkedTrackers(["none"])).toEqual([]);
    expect(checkedTrackers(["wandb", "tensorboard"])).toEqual(["tensorboard", "wandb"]);
    for (const v of [["tensorboard", "wandb"], ["mlflow"], ["none"]]) expect(reportToValue(checkedTrackers(v))).toEqual(v);
  });
});
