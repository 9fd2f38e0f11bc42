// "Plan for": the plan preview for this host (the default) or for a shipped hardware profile, a host declared
// rather than detected (GET /api/profiles; POST /api/plan's `profile`, docs/interfaces.md §6). A plan for a profile
// says so where its verdict is: its times are predicted from the profile's declared figures, not measured.

import { h } from "../dom";
import type { Plan, ProfileSummary } from "../types";

export type { ProfileSummary };

/** What the verdict area says of a plan made for a declared host; null for a plan of a real host. */
export function declaredWords(plan: Pick<Plan, "declared"> | null | undefined): string | null {
  const d = plan?.declared;
  if (!d || typeof d.profile !== "string") return null;
  return `Declared host: ${d.description || d.profile} — predicted from declared figures, not measured`;
}

export function renderDeclared(plan: Pick<Plan, "declared"> | null | undefined): HTMLElement | null {
  const text = declaredWords(plan);
  return text ? h("p", { class: "plan-declared warn-box", role: "note", "data-part": "declared" }, text) : null;
}

/** The request body for the plan preview: the form's config, with `profile` when one is chosen (a profile replaces
 *  the host: the API plans for one or the other). */
export function planBody(cfg: Record<string, unknown>, profile: string): Record<string, unknown> {
  if (!profile) return cfg;
  const { host: _host, ...rest } = cfg;
  return { ...rest, profile };
}

/** The choices of the "Plan for" select: this host first (the default), then every shipped profile. */
export function planForOptions(profiles: ProfileSummary[]): { value: string; label: string }[] {
  return [{ value: "", label: "This host" }, ...profiles.map((p) => ({ value: p.name, label: `${p.name} — ${p.description}` }))];
}

/** The "Plan for" select: this host, or one of the shipped profiles (hidden when the API lists none). */
export function planForField(profiles: ProfileSummary[]): { wrap: HTMLElement; select: HTMLSelectElement } {
  const select = h("select", { id: "f-plan-for", "aria-describedby": "f-plan-for-help" }, planForOptions(profiles).map((o) => h("option", { value: o.value }, o.label)));
  const help = h("p", { class: "help", id: "f-plan-for-help" }, "A profile plans for a declared host: its figures, not measured here. Only the preview; a job runs on a real host.");
  const wrap = h("div", { class: "field plan-for" }, h("label", { for: "f-plan-for" }, "Plan for"), select, help);
  if (!profiles.length) wrap.hidden = true;
  return { wrap, select };
}
