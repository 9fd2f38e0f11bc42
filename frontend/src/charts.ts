// The charts of the job page, one module per kind under charts/ (loss, gradient norm, step time, throughput,
// memory: each a ChartSpec, charts/spec.ts), drawn live by charts/live.ts. Every chart redraws from the whole
// stored run; its layout follows the data (new phases, more GPUs, a prediction appearing).
import { gradNormChart } from "./charts/gradnorm";
import { lossChart } from "./charts/loss";
import { memoryChart } from "./charts/memory";
import type { ChartSpec } from "./charts/spec";
import { stepTimeChart } from "./charts/steptime";
import { throughputChart } from "./charts/throughput";

export { LiveChart } from "./charts/live";
export * from "./charts/spec";
export { logTickLabels, secondsTick } from "./charts/ticks";
export { gradNormChart, lossChart, memoryChart, stepTimeChart, throughputChart };

export const JOB_CHARTS: ChartSpec[] = [lossChart, gradNormChart, stepTimeChart, throughputChart, memoryChart];
