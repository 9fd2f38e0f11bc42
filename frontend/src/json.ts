// Python's json module writes NaN and Infinity as bare tokens, which JSON.parse rejects. A NaN loss is exactly
// what the job page must show, so the UI parses leniently instead of dropping the record.

const SENTINELS: Record<string, number> = {
  "\u0000NaN": NaN,
  "\u0000Infinity": Infinity,
  "\u0000-Infinity": -Infinity,
};

/** Quote the bare NaN / Infinity / -Infinity tokens that sit outside strings, leaving everything else intact. */
export function quoteNonFinite(text: string): string {
  let out = "";
  let i = 0;
  let last = 0;
  const n = text.length;
  while (i < n) {
    const c = text[i];
    if (c === '"') {
      // Skip the string, honouring backslash escapes.
      i++;
      while (i < n && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
      i++;
      continue;
    }
    let token: string | null = null;
    if (c === "N" && text.startsWith("NaN", i)) token = "NaN";
    else if (c === "I" && text.startsWith("Infinity", i)) token = "Infinity";
    else if (c === "-" && text.startsWith("-Infinity", i)) token = "-Infinity";
    if (token !== null) {
      out += text.slice(last, i) + JSON.stringify("\u0000" + token);
      i += token.length;
      last = i;
      continue;
    }
    i++;
  }
  return last === 0 ? text : out + text.slice(last);
}

/** JSON.parse that also accepts Python's NaN, Infinity and -Infinity and turns them into numbers. */
export function parseJson<T = unknown>(text: string): T {
  try {
    return JSON.parse(text) as T;
  } catch (first) {
    const quoted = quoteNonFinite(text);
    if (quoted === text) throw first;
    return JSON.parse(quoted, (_key, value) =>
      typeof value === "string" && value in SENTINELS ? SENTINELS[value] : value,
    ) as T;
  }
}
