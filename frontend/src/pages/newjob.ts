// New job: presets, every config key grouped as a person thinks of a job, the AutoPolicy plan preview,
// and the API's field errors shown at the field they name.
import { api, ApiError } from "../api";
import { h, replace } from "../dom";
import { annotate } from "../glossary";
import { apiAbsent } from "../health";
import { renderPlan, type PlanAnswer } from "../plan";
import { planBody, planForField, type ProfileSummary } from "../planview/planfor";
import { navigate, type Cleanup } from "../router";
import { fieldForLoc, getPath, jobKeys, leafPaths, setPath, type KeyInfo } from "../schema";
import { checkedTrackers, fieldLabel, GROUPS, reportToValue, TRACKER_LABELS, TRACKER_NAMES, TRACKERS_KEY, type Slot } from "../jobform";
import type { FieldErrorItem, Host, Preset, TrackerInfo } from "../types";
import { errorBox } from "../ui";

// Keys the request accepts next to the config: shown at the top, never inside a config section.
const FILING = new Set(["name", "host"]);

const fid = (path: string) => "f-" + path.replace(/[^a-zA-Z0-9]+/g, "-");

class ParseProblem extends Error {}

/** One config key's control(s), its help and its error line. */
class Field {
  readonly wrap: HTMLElement;
  readonly inputs: (HTMLInputElement | HTMLSelectElement)[] = [];
  private readonly errEl: HTMLElement;

  constructor(
    readonly path: string,
    label: string,
    readonly info: KeyInfo,
    onChange: () => void,
  ) {
    const id = fid(path);
    const helpId = `${id}-help`;
    const errId = `${id}-error`;
    const def = info.hasDefault ? info.default : undefined;
    // A config key whose default is null is decided at run time (planner, host): say "auto".
    const decided = info.nullable && !FILING.has(path) ? "auto" : "";
    const defText = def === undefined || def === null ? decided : Array.isArray(def) ? def.join(", ") : String(def);
    this.errEl = h("p", { class: "field-error", id: errId, "data-field": path, hidden: true });
    const described = [info.description ? helpId : null, errId].filter(Boolean).join(" ");
    let control: HTMLElement;
    if (info.type === "enum" || info.type === "boolean") {
      const opts = info.type === "boolean" ? ["true", "false"] : (info.options ?? []);
      const show = (o: string) => (info.type === "boolean" ? (o === "true" ? "yes" : "no") : o);
      const sel = h(
        "select",
        { id, name: path, "aria-describedby": described },
        info.required ? null : h("option", { value: "" }, path === "host" ? "any host" : defText ? `default (${info.type === "boolean" ? show(defText) : defText})` : "default"),
        opts.map((o) => h("option", { value: o }, show(o))),
      );
      this.inputs.push(sel);
      control = sel;
    } else if (info.type === "pair") {
      const defs = Array.isArray(def) ? def : [];
      const a = h("input", { id, name: `${path}[0]`, type: "text", inputmode: "decimal", placeholder: defs[0] !== undefined ? String(defs[0]) : "", "aria-describedby": described, "aria-label": `${label}, first` });
      const b = h("input", { id: `${id}-1`, name: `${path}[1]`, type: "text", inputmode: "decimal", placeholder: defs[1] !== undefined ? String(defs[1]) : "", "aria-describedby": described, "aria-label": `${label}, second` });
      this.inputs.push(a, b);
      control = h("div", { class: "pair" }, a, b);
    } else {
      const numeric = info.type === "integer" || info.type === "number";
      const input = h("input", {
        id,
        name: path,
        type: "text",
        inputmode: info.type === "integer" ? "numeric" : info.type === "number" ? "decimal" : undefined,
        autocomplete: "off",
        spellcheck: numeric ? "false" : undefined,
        placeholder: defText,
        required: info.required,
        "aria-describedby": described,
      });
      this.inputs.push(input);
      control = input;
    }
    for (const el of this.inputs) {
      el.addEventListener("input", () => {
        this.setError(null);
        onChange();
      });
      el.addEventListener("change", onChange);
    }
    this.wrap = h(
      "div",
      { class: "field", "data-path": path },
      // The asterisk sits outside the label so the field's accessible name is the label alone.
      h("div", { class: "label-row" }, h("label", { for: id, title: info.description }, label), info.required ? h("span", { class: "req", title: "required" }, "*") : null),
      control,
      info.description ? h("p", { class: "help", id: helpId }, info.description) : null,
      this.errEl,
    );
  }

  /** The value to send; undefined leaves the key out (the server's default applies). */
  value(): unknown {
    const raw = this.inputs.map((i) => i.value.trim());
    if (raw.every((r) => r === "")) return undefined;
    const parseNum = (r: string, int: boolean) => {
      if (r === "") throw new ParseProblem("give both numbers, or neither for the default");
      const v = Number(r);
      if (!Number.isFinite(v)) throw new ParseProblem(`must be ${int ? "an integer" : "a number"}, got "${r}"`);
      return v;
    };
    switch (this.info.type) {
      case "integer":
        return parseNum(raw[0], true);
      case "number":
        return parseNum(raw[0], false);
      case "boolean":
        return raw[0] === "true";
      case "pair":
        return raw.map((r) => parseNum(r, false));
      case "unknown":
        try {
          return JSON.parse(raw[0]);
        } catch {
          return raw[0];
        }
      default:
        return this.inputs[0].value;
    }
  }

  set(v: unknown): void {
    if (this.info.type === "pair") {
      const arr = Array.isArray(v) ? v : [];
      this.inputs.forEach((el, i) => (el.value = arr[i] === undefined || arr[i] === null ? "" : String(arr[i])));
      return;
    }
    const el = this.inputs[0];
    const text = v === undefined || v === null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
    if (el instanceof HTMLSelectElement && text !== "" && ![...el.options].some((o) => o.value === text)) {
      el.append(h("option", { value: text }, text));
    }
    el.value = text;
  }

  setError(msg: string | null): void {
    this.errEl.hidden = !msg;
    this.errEl.textContent = msg ?? "";
    for (const el of this.inputs) {
      if (msg) el.setAttribute("aria-invalid", "true");
      else el.removeAttribute("aria-invalid");
    }
    this.wrap.classList.toggle("has-error", !!msg);
  }

  focus(): void {
    this.inputs[0].focus();
  }

  /** What was typed (a pair: both texts), sent as it is when it cannot be read as the key's type: the API then
   *  names it together with every other problem it finds. */
  text(): unknown {
    const raw = this.inputs.map((i) => i.value.trim());
    return this.info.type === "pair" ? raw : raw[0];
  }
}

/** Config `report_to` as one checkbox per tracker, each saying whether this server has its package and what else
 *  it needs (GET /api/presets `trackers`). Same surface as Field, so the form collects it like any other key. */
class TrackersField {
  readonly wrap: HTMLElement;
  readonly inputs: HTMLInputElement[] = [];
  private readonly errEl: HTMLElement;

  constructor(
    readonly path: string,
    info: KeyInfo | null,
    trackers: readonly TrackerInfo[],
    onChange: () => void,
  ) {
    const id = fid(path);
    this.errEl = h("p", { class: "field-error", id: `${id}-error`, "data-field": path, hidden: true });
    const known = new Map(trackers.map((t) => [t.name, t]));
    const rows = TRACKER_NAMES.map((name) => {
      const t = known.get(name);
      const box = h("input", { type: "checkbox", id: `${id}-${name}`, name: path, value: name, checked: name === "tensorboard", "aria-describedby": `${id}-${name}-help ${id}-error` });
      box.addEventListener("change", () => {
        this.setError(null);
        onChange();
      });
      this.inputs.push(box);
      const state = !t ? "This server did not say whether its package is installed." : t.installed ? `Installed on this server.${t.problem ? ` Not ready: ${t.problem}.` : ""}` : `Not installed on this server: pip install ${t.missing.join(" ")} (or 'slidedp[trackers]').`;
      return h(
        "div",
        { class: "tracker", dataset: { tracker: name, installed: t ? String(t.installed) : "unknown" } },
        h("label", { class: "check", for: `${id}-${name}` }, box, ` ${t?.label ?? TRACKER_LABELS[name] ?? name}`),
        h("p", { class: "help", id: `${id}-${name}-help` }, h("span", { class: t && !t.installed ? "warn-text" : "muted" }, state), t?.needs ? ` Needs: ${t.needs}` : ""),
      );
    });
    this.wrap = h(
      "div",
      { class: "field trackers", "data-path": path },
      h("div", { class: "label-row" }, h("span", { class: "label", id: `${id}-label`, title: info?.description }, "Report to")),
      h("div", { role: "group", "aria-labelledby": `${id}-label` }, rows),
      h("p", { class: "help" }, "TensorBoard is on unless you untick it: a job writes its event files where the package is installed. A ticked tracker the job's host lacks is refused when the job is submitted."),
      this.errEl,
    );
  }

  checked(): string[] {
    return this.inputs.filter((b) => b.checked).map((b) => b.value);
  }

  value(): unknown {
    return reportToValue(this.checked());
  }

  set(v: unknown): void {
    const on = checkedTrackers(v);
    for (const b of this.inputs) b.checked = on.includes(b.value);
  }

  setError(msg: string | null): void {
    this.errEl.hidden = !msg;
    this.errEl.textContent = msg ?? "";
    this.wrap.classList.toggle("has-error", !!msg);
  }

  focus(): void {
    this.inputs[0]?.focus();
  }

  text(): unknown {
    return this.value();
  }
}

/** The API's problems together with the form's own: a field the form could not read keeps the form's message. */
export function mergeProblems(local: FieldErrorItem[], remote: FieldErrorItem[]): FieldErrorItem[] {
  const under = (loc: string, path: string) => loc === path || loc.startsWith(path + ".") || loc.startsWith(path + "[");
  return [...local, ...remote.filter((e) => !local.some((l) => under(e.loc, l.loc)))];
}

function fallbackInfo(slot: Slot): KeyInfo {
  return { path: slot.path, type: slot.kind, hasDefault: false, required: slot.path === "model" || slot.path === "data.path", nullable: false };
}

export function newJobPage(root: HTMLElement): Cleanup {
  let stopped = false;
  const body = h("div", null, h("p", { class: "muted" }, "Loading the form…"));
  replace(root, h("div", { class: "page-head" }, h("h1", null, "New job")), body);

  void (async () => {
    if (await apiAbsent()) {
      replace(body, h("p", { class: "muted" }, "The form needs the API for presets, validation and the plan; it appears once the API answers."));
      return;
    }
    const [openapi, presets, hosts, profiles] = await Promise.allSettled([api.openapi(), api.presets(), api.hosts(), api.profiles()]);
    if (stopped) return;
    const keys = openapi.status === "fulfilled" ? jobKeys(openapi.value) : [];
    const presetList: Preset[] = presets.status === "fulfilled" ? (presets.value.items ?? []) : [];
    const hostList: Host[] = hosts.status === "fulfilled" ? (hosts.value.items ?? []) : [];
    const profileList: ProfileSummary[] = profiles.status === "fulfilled" ? (profiles.value.items ?? []) : [];
    const trackerList: TrackerInfo[] = presets.status === "fulfilled" ? (presets.value.trackers ?? []) : [];
    build(keys, presetList, hostList, presets.status === "rejected" ? presets.reason : null, profileList, trackerList);
  })();

  function build(keys: KeyInfo[], presets: Preset[], hosts: Host[], presetError: unknown, profiles: ProfileSummary[] = [], trackers: TrackerInfo[] = []): void {
    const byPath = new Map(keys.map((k) => [k.path, k]));
    const fields = new Map<string, Field | TrackersField>();
    const summary = h("div", { class: "form-summary", role: "alert", hidden: true });
    const preview = h("pre", { class: "body-preview" });
    const planEl = h("div", { class: "plan-panel", id: "plan-preview", "aria-live": "polite" });
    let presetBase: Record<string, unknown> = {};

    const changed = () => {
      try {
        preview.textContent = JSON.stringify(collect(), null, 2);
      } catch (err) {
        preview.textContent = `(${(err as Error).message})`;
      }
    };

    const mk = (path: string, label: string, fallback: Slot | null) => {
      const info = byPath.get(path) ?? (fallback ? fallbackInfo(fallback) : null);
      if (!info) return null;
      const f = new Field(path, label, info, changed);
      fields.set(path, f);
      return f.wrap;
    };

    // Job-level choices.
    const presetSel = h("select", { id: "f-preset" }, h("option", { value: "" }, "— none —"), presets.map((p) => h("option", { value: p.id }, p.label)));
    const presetDesc = h("p", { class: "help", id: "f-preset-help" });
    presetSel.setAttribute("aria-describedby", "f-preset-help");
    const hostSlot = byPath.get("host") ?? { path: "host", type: "string", hasDefault: true, default: null, required: false, nullable: true };
    const hostField = new Field("host", "Host", { ...hostSlot, type: "enum", options: hosts.map((x) => x.name) }, changed);
    fields.set("host", hostField);
    const nameWrap = mk("name", "Job name", { path: "name", label: "Job name", kind: "string" });

    // Policy: AutoPolicy decides everything, or some choices are overridden.
    const autoRadio = h("input", { type: "radio", name: "policy-mode", id: "policy-auto", value: "auto", checked: true });
    const overRadio = h("input", { type: "radio", name: "policy-mode", id: "policy-override", value: "override" });
    const policyFields = h("div", { class: "field-grid", id: "policy-fields", hidden: true });
    const syncPolicy = () => {
      policyFields.hidden = !overRadio.checked;
      changed();
    };
    autoRadio.addEventListener("change", syncPolicy);
    overRadio.addEventListener("change", syncPolicy);

    const sections: HTMLElement[] = [];
    const placed = new Set<string>(["name", "host"]);
    for (const g of GROUPS) {
      const wraps = g.slots.map((slot) => {
        placed.add(slot.path);
        if (slot.path === TRACKERS_KEY) {
          const f = new TrackersField(slot.path, byPath.get(slot.path) ?? null, trackers, changed);
          fields.set(slot.path, f);
          return f.wrap;
        }
        return mk(slot.path, slot.label, keys.length ? null : slot);
      });
      if (g.id === "policy") {
        policyFields.append(...wraps.filter((w): w is HTMLElement => !!w));
        sections.push(
          h(
            "fieldset",
            { class: "group", id: "group-policy" },
            h("legend", null, "Execution policy"),
            h("div", { class: "radios", role: "radiogroup", "aria-label": "Policy mode" }, h("label", { for: "policy-auto", class: "check" }, autoRadio, " AutoPolicy decides (recommended)"), h("label", { for: "policy-override", class: "check" }, overRadio, " Override some choices")),
            policyFields,
          ),
        );
        continue;
      }
      sections.push(h("fieldset", { class: "group", id: `group-${g.id}` }, h("legend", null, g.title), g.intro ? h("p", { class: "help group-intro" }, g.intro) : null, h("div", { class: "field-grid" }, wraps)));
    }
    // Keys the schema has and the layout does not know yet still get a field.
    const others = keys.filter((k) => !placed.has(k.path) && !FILING.has(k.path));
    if (others.length) {
      sections.push(h("fieldset", { class: "group", id: "group-other" }, h("legend", null, "Other"), h("div", { class: "field-grid" }, others.map((k) => mk(k.path, fieldLabel(k.path), null)))));
    }
    const isPolicy = (path: string) => path.startsWith("policy.");

    /** The request body. A field that cannot be read throws, or with `unread` is told there and sent as typed. */
    function collect(unread?: (e: FieldErrorItem) => void): Record<string, unknown> {
      // Keys a preset sets that no field shows are sent as the preset has them.
      const out: Record<string, unknown> = {};
      for (const p of leafPaths(presetBase)) if (!fields.has(p)) setPath(out, p, getPath(presetBase, p));
      for (const [path, f] of fields) {
        if (isPolicy(path) && !overRadio.checked) continue;
        let v: unknown;
        try {
          v = f.value();
        } catch (err) {
          if (!unread) throw new ParseProblem(`${path}: ${(err as Error).message}`);
          unread({ loc: path, msg: (err as Error).message });
          v = f.text();
        }
        if (v !== undefined) setPath(out, path, v);
      }
      return out;
    }

    function applyPreset(id: string): void {
      const p = presets.find((x) => x.id === id);
      presetBase = p?.config ?? {};
      presetDesc.textContent = p?.description ?? "";
      for (const [path, f] of fields) {
        if (path === "host" || path === "name") continue;
        f.set(getPath(presetBase, path));
        f.setError(null);
      }
      // A preset that spells out policy keys at their defaults ("auto") still leaves AutoPolicy in charge.
      const overrides = leafPaths(presetBase).some((p) => {
        if (!isPolicy(p)) return false;
        const info = byPath.get(p);
        return !info || !info.hasDefault || JSON.stringify(info.default) !== JSON.stringify(getPath(presetBase, p));
      });
      overRadio.checked = overrides;
      autoRadio.checked = !overrides;
      summary.hidden = true;
      replace(planEl);
      syncPolicy();
    }
    presetSel.addEventListener("change", () => applyPreset(presetSel.value));

    /** Show every problem at once: each at its field (a field's messages together under it), all of them in the
     *  summary at the top. Focus the first field (or the summary), unless `focus` is false. */
    function showErrors(errs: FieldErrorItem[], heading: string, focus = true): void {
      for (const f of fields.values()) f.setError(null);
      const shown = new Set(fields.keys());
      const at = new Map<Field | TrackersField, string[]>();
      let marked = 0;
      for (const e of errs) {
        const path = fieldForLoc(e.loc, shown);
        const f = path ? fields.get(path) : undefined;
        if (f && !(isPolicy(f.path) && !overRadio.checked)) {
          at.set(f, [...(at.get(f) ?? []), path === e.loc ? e.msg : `${e.loc}: ${e.msg}`]);
          marked++;
        }
      }
      for (const [f, msgs] of at) f.setError(msgs.join("\n"));
      const first = [...fields.values()].find((f) => at.has(f)) ?? null; // in the form's order
      summary.hidden = false;
      replace(
        summary,
        h("strong", null, heading),
        ` ${errs.length} problem${errs.length === 1 ? "" : "s"}${marked ? `, ${marked === errs.length ? "each" : marked} marked at ${marked === 1 ? "its field" : "the fields"}` : ""}:`,
        h("ul", { class: "problem-list" }, errs.map((e) => h("li", null, e.loc ? `${e.loc}: ${e.msg}` : e.msg))),
      );
      if (!focus) return;
      if (first) first.focus();
      else summary.focus();
    }

    function clearErrors(): void {
      for (const f of fields.values()) f.setError(null);
      summary.hidden = true;
      replace(summary);
    }

    /** The body to send, and the fields the form could not read (sent as typed, which the API refuses by name, so
     *  that one answer holds every problem). */
    function gather(): { cfg: Record<string, unknown>; local: FieldErrorItem[] } {
      const local: FieldErrorItem[] = [];
      const cfg = collect((e) => local.push(e));
      return { cfg, local };
    }

    const planBtn = h("button", { type: "button", id: "plan-button", class: "secondary" }, "Plan");
    const planFor = planForField(profiles);
    const submitBtn = h("button", { type: "submit", id: "submit-button", class: "primary" }, "Submit job");
    const busy = h("span", { class: "muted", role: "status" });

    planBtn.addEventListener("click", async () => {
      const { cfg, local } = gather();
      clearErrors();
      planBtn.disabled = true;
      busy.textContent = "Planning…";
      replace(planEl, h("p", { class: "muted" }, "Planning…"));
      try {
        const plan: PlanAnswer = await api.plan(planBody(cfg, planFor.select.value));
        replace(planEl, h("h2", null, "Plan preview"), renderPlan(plan, { title: "Plan preview" }));
        // What blocks the job is also marked at its fields; the preview says it first, and keeps the focus.
        const blocking = mergeProblems(local, plan.problems ?? []);
        if (blocking.length) showErrors(blocking, "The job cannot run as it is:", false);
        annotate(planEl);
      } catch (err) {
        if (err instanceof ApiError && err.fieldErrors.length) {
          replace(planEl);
          showErrors(mergeProblems(local, err.fieldErrors), "The plan cannot be made:");
        } else {
          replace(planEl, errorBox(err, "the plan"));
          if (local.length) showErrors(local, "Check the form:", false);
        }
      } finally {
        planBtn.disabled = false;
        busy.textContent = "";
      }
    });

    const form = h("form", { class: "job-form", novalidate: true, "aria-label": "New job" });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const { cfg, local } = gather();
      clearErrors();
      submitBtn.disabled = true;
      busy.textContent = "Submitting…";
      try {
        if (local.length) {
          // A field the form cannot read is never submitted: the plan preview, which creates nothing, names what
          // else is wrong (it refuses such a body with every problem), so all of them are marked at once.
          const plan: PlanAnswer = await api.plan(cfg);
          showErrors(mergeProblems(local, plan.problems ?? []), "The job was not submitted:");
        } else {
          const job = await api.createJob(cfg);
          navigate(`/jobs/${job.id}`);
        }
      } catch (err) {
        if (err instanceof ApiError && err.fieldErrors.length) showErrors(mergeProblems(local, err.fieldErrors), "The job was not submitted:");
        else if (local.length) showErrors(local, "The job was not submitted:");
        else {
          summary.hidden = false;
          replace(summary, errorBox(err, "the job submission"));
          summary.focus();
        }
      } finally {
        submitBtn.disabled = false;
        busy.textContent = "";
      }
    });
    summary.tabIndex = -1;

    replace(
      form,
      summary,
      h(
        "fieldset",
        { class: "group", id: "group-job" },
        h("legend", null, "Job"),
        h("div", { class: "field-grid" }, h("div", { class: "field" }, h("label", { for: "f-preset" }, "Preset"), presetSel, presetDesc), nameWrap, hostField.wrap),
        presetError ? errorBox(presetError, "the presets") : null,
      ),
      sections,
      h("details", { class: "raw" }, h("summary", null, "Request body"), preview),
      h("div", { class: "form-actions" }, planFor.wrap, planBtn, submitBtn, busy),
    );
    replace(body, h("div", { class: "new-job" }, form, planEl));
    if (!keys.length) body.prepend(h("p", { class: "error-box" }, "The API's schema could not be read: the form shows every key as text, without defaults or help."));
    const wanted = new URLSearchParams(location.search).get("preset");
    const start = presets.find((p) => p.id === wanted) ?? presets[0];
    if (start) {
      presetSel.value = start.id;
      applyPreset(start.id);
    } else changed();
  }

  return () => {
    stopped = true;
  };
}
