// The job page's checkpoints panel: the job's checkpoints as a table, read when the job has ended.
import { api } from "../../api";
import { h, replace } from "../../dom";
import { bytes } from "../../fmt";
import { errorBox } from "../../ui";

export interface CheckpointsPanel {
  readonly el: HTMLElement;
  /** Read the job's checkpoints and show them; `left()` says the page is gone, and nothing is shown then. */
  load(left: () => boolean): Promise<void>;
}

export function checkpointsPanel(id: number): CheckpointsPanel {
  const el = h("div", null, h("p", { class: "muted" }, "No checkpoints."));
  return {
    el,
    async load(left) {
      try {
        const { items } = await api.checkpoints(id);
        if (left()) return;
        replace(
          el,
          items.length
            ? h(
                "table",
                { class: "data-table" },
                h("thead", null, h("tr", null, ["Name", "Step", "Size", "Path"].map((c) => h("th", { scope: "col" }, c)))),
                h("tbody", null, items.map((c) => h("tr", null, h("td", null, c.name), h("td", { class: "num" }, c.step ?? "–"), h("td", { class: "num" }, bytes(c.bytes)), h("td", null, h("code", null, c.path ?? ""))))),
              )
            : h("p", { class: "muted" }, "No checkpoints."),
        );
      } catch (err) {
        if (!left()) replace(el, errorBox(err, "the checkpoints"));
      }
    },
  };
}
