import { describe, expect, it } from "vitest";
import { shellWord, tensorboardCommand, tensorboardDir } from "./trackers";

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

  it("writes a command a shell runs as it is, quoting a folder only when it must", () => {
    expect(tensorboardCommand("/data/jobs/7/tensorboard")).toBe("tensorboard --logdir /data/jobs/7/tensorboard");
    expect(tensorboardCommand("/runs/my run/tensorboard")).toBe("tensorboard --logdir '/runs/my run/tensorboard'");
    expect(shellWord("it's")).toBe(`'it'"'"'s'`);
    expect(shellWord("$HOME")).toBe("'$HOME'");
  });
});
