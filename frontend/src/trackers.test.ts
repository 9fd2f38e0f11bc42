import { describe, expect, it } from "vitest";
import { reportsToTensorboard, shellWord, tensorboardCommand, tensorboardDir } from "./trackers";

describe("experiment trackers on the job page", () => {
  it("finds the TensorBoard folder in the job's output folder unless report_to leaves TensorBoard out", () => {
    const out = "/data/jobs/7";
    expect(tensorboardDir({ output_dir: out, config: {} })).toBe("/data/jobs/7/tensorboard"); // the default
    expect(tensorboardDir({ output_dir: out + "/", config: { report_to: null } })).toBe("/data/jobs/7/tensorboard");
    expect(tensorboardDir({ output_dir: out, config: { report_to: ["wandb", "tensorboard"] } })).toBe("/data/jobs/7/tensorboard");
    expect(tensorboardDir({ output_dir: out, config: { report_to: ["wandb", "mlflow"] } })).toBeNull();
    expect(tensorboardDir({ output_dir: out, config: { report_to: ["none"] } })).toBeNull();
    expect(tensorboardDir({ output_dir: out, config: { report_to: [] } })).toBeNull();
    expect(tensorboardDir({ output_dir: "", config: {} })).toBeNull();
  });

  it("names the folder only when the API says it holds event files", () => {
    const job = { output_dir: "/data/jobs/8", config: {} };
    expect(tensorboardDir({ ...job, tensorboard_events: true })).toBe("/data/jobs/8/tensorboard");
    // the default tracker without its package wrote nothing: no folder to point at
    expect(tensorboardDir({ ...job, tensorboard_events: false })).toBeNull();
    expect(tensorboardDir({ ...job, config: { report_to: ["tensorboard"] }, tensorboard_events: false })).toBeNull();
    expect(tensorboardDir({ ...job, config: { report_to: ["mlflow"] }, tensorboard_events: true })).toBeNull();
    expect(reportsToTensorboard({ config: { report_to: ["mlflow"] } })).toBe(false);
    expect(reportsToTensorboard({ config: {} })).toBe(true);
  });

  it("writes a command a shell runs as it is, quoting a folder only when it must", () => {
    expect(tensorboardCommand("/data/jobs/7/tensorboard")).toBe("tensorboard --logdir /data/jobs/7/tensorboard");
    expect(tensorboardCommand("/runs/my run/tensorboard")).toBe("tensorboard --logdir '/runs/my run/tensorboard'");
    expect(shellWord("it's")).toBe(`'it'"'"'s'`);
    expect(shellWord("$HOME")).toBe("'$HOME'");
  });
});
