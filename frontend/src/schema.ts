// The job config's keys as the API documents them (OpenAPI components.schemas.JobCreate, built from the
// runtime's one JobConfig): types, choices, defaults and docs for the form, so the UI repeats none of them.

type Obj = Record<string, unknown>;

export interface KeyInfo {
  path: string;
  type: "string" | "integer" | "number" | "boolean" | "enum" | "pair" | "unknown";
  options?: string[];
  default?: unknown;
  hasDefault: boolean;
  required: boolean;
  nullable: boolean;
  description?: string;
}

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function resolve(spec: Obj, node: unknown, seen = 0): Obj {
  if (!isObj(node) || seen > 20) return {};
  const ref = node.$ref;
  if (typeof ref === "string" && ref.startsWith("#/")) {
    let cur: unknown = spec;
    for (const part of ref.slice(2).split("/")) cur = isObj(cur) ? cur[part] : undefined;
    // Keys next to a $ref (description, default) override the referenced schema's.
    const { $ref: _ignored, ...rest } = node;
    return { ...resolve(spec, cur, seen + 1), ...rest };
  }
  if (Array.isArray(node.allOf) && node.allOf.length === 1) {
    const { allOf, ...rest } = node;
    return { ...resolve(spec, allOf[0], seen + 1), ...rest };
  }
  return node;
}

function describe(spec: Obj, node: Obj): Pick<KeyInfo, "type" | "options" | "nullable"> & { object?: Obj } {
  let nullable = false;
  let n = node;
  const alts = (Array.isArray(n.anyOf) ? n.anyOf : Array.isArray(n.oneOf) ? n.oneOf : null) as unknown[] | null;
  if (alts) {
    const nonNull = alts.map((a) => resolve(spec, a)).filter((a) => a.type !== "null");
    nullable = nonNull.length < alts.length;
    n = nonNull.length === 1 ? { ...nonNull[0] } : n;
  }
  if (Array.isArray(n.enum)) return { type: "enum", options: n.enum.map(String), nullable };
  if (n.const !== undefined) return { type: "enum", options: [String(n.const)], nullable };
  if (n.type === "object" || isObj(n.properties)) return { type: "unknown", nullable, object: n };
  if (n.type === "array" && Array.isArray(n.prefixItems) && n.prefixItems.length === 2) return { type: "pair", nullable };
  if (n.type === "integer" || n.type === "number" || n.type === "boolean" || n.type === "string") {
    return { type: n.type, nullable };
  }
  return { type: "unknown", nullable };
}

/** Every leaf key of the job request body, nested sections flattened to dotted paths, in schema order. */
export function jobKeys(spec: unknown, schemaName = "JobCreate"): KeyInfo[] {
  if (!isObj(spec)) return [];
  const schemas = (spec.components as Obj | undefined)?.schemas as Obj | undefined;
  const root = schemas?.[schemaName];
  if (!isObj(root)) return [];
  const out: KeyInfo[] = [];
  const walk = (node: Obj, prefix: string, depth: number) => {
    const props = node.properties;
    if (!isObj(props) || depth > 5) return;
    const required = new Set(Array.isArray(node.required) ? node.required.map(String) : []);
    for (const [key, raw] of Object.entries(props)) {
      const prop = resolve(spec, raw);
      const d = describe(spec, prop);
      const path = prefix + key;
      if (d.object && isObj(d.object.properties)) {
        walk(resolve(spec, d.object), path + ".", depth + 1);
        continue;
      }
      out.push({
        path,
        type: d.type,
        options: d.options,
        nullable: d.nullable,
        hasDefault: "default" in prop,
        default: prop.default,
        required: required.has(key),
        description: typeof prop.description === "string" ? prop.description : undefined,
      });
    }
  };
  walk(resolve(spec, root), "", 0);
  return out;
}

/** Set a dotted path in a nested object, creating sections on the way. */
export function setPath(obj: Obj, path: string, value: unknown): void {
  const parts = path.split(".");
  let cur = obj;
  for (const p of parts.slice(0, -1)) {
    if (!isObj(cur[p])) cur[p] = {};
    cur = cur[p] as Obj;
  }
  cur[parts[parts.length - 1]] = value;
}

/** Read a dotted path of a nested object (undefined when absent). */
export function getPath(obj: unknown, path: string): unknown {
  let cur: unknown = obj;
  for (const p of path.split(".")) cur = isObj(cur) ? cur[p] : undefined;
  return cur;
}

/** Leaf paths of a nested object ({"data": {"path": x}} -> ["data.path"]); arrays are leaves. */
export function leafPaths(obj: unknown, prefix = ""): string[] {
  if (!isObj(obj)) return [];
  const out: string[] = [];
  for (const [k, v] of Object.entries(obj)) {
    if (isObj(v)) out.push(...leafPaths(v, prefix + k + "."));
    else out.push(prefix + k);
  }
  return out;
}

/** The form field that shows an error for `loc`: itself, else the nearest listed parent ("optimizer.betas[1]"
 *  -> "optimizer.betas"); null when none of the form's fields owns it. */
export function fieldForLoc(loc: string, fields: ReadonlySet<string>): string | null {
  let p = loc;
  while (p) {
    if (fields.has(p)) return p;
    const stripped = p.replace(/\[\d+\]$/, "");
    if (stripped !== p) {
      p = stripped;
      continue;
    }
    const dot = p.lastIndexOf(".");
    if (dot < 0) break;
    p = p.slice(0, dot);
  }
  return null;
}
