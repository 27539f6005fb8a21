// Shared by the viewer and the play page: DOM building, the API call, and how an episode reads.
//
// Every string shown comes from a model, a user or a server: it only ever becomes a text node
// (el() and textContent), never markup, and no URL from data becomes a link. The page's
// Content-Security-Policy backs this up: only these files may run.

export function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "href") node.setAttribute("href", internalHref(value));
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "value") node.value = value;
    else if (key === "checked" || key === "disabled" || key === "selected" || key === "open") node[key] = Boolean(value);
    else node.setAttribute(key, String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

// Links go only to this page's own routes: data never chooses where a link leads.
function internalHref(value) {
  const href = String(value);
  if (!href.startsWith("#/") && !href.startsWith("/")) throw new Error("refusing a link that is not internal");
  if (href.startsWith("//")) throw new Error("refusing a link to another host");
  return href;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

// Replaces a node's children (null, false and undefined children are left out, as in el()).
export function fill(node, ...children) {
  clear(node);
  append(node, children);
  return node;
}

export async function api(path, options = {}) {
  const init = { method: options.method || "GET", headers: {} };
  if (options.body !== undefined || init.method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.body === undefined ? {} : options.body);
  }
  const response = await fetch(path, init);
  let payload = null;
  try {
    payload = await response.json();
  } catch (error) {
    throw new Error(`${path}: HTTP ${response.status}, not JSON`);
  }
  if (!response.ok) throw new Error(payload && payload.error ? payload.error : `${path}: HTTP ${response.status}`);
  return payload;
}

export function fmtReward(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? value.toFixed(1) : value.toFixed(3);
}

export function fmtCount(value) {
  return value === null || value === undefined ? "" : Number(value).toLocaleString("en-US");
}

export function rewardBadge(value, extraClass) {
  const cls = value === null || value === undefined ? "none" : (typeof value === "number" && value > 0 ? "good" : "bad");
  return el("span", { class: `reward ${cls} ${extraClass || ""}`.trim(), title: "reward" }, fmtReward(value));
}

// ---- text and JSON that may be long ---------------------------------------------------------

const FOLD_CHARS = 1500;
const FOLD_LINES = 24;

// A <pre> of the text; long text shows its start and a button for the rest.
export function folded(text, cls) {
  text = String(text);
  const pre = el("pre", { class: `text ${cls || ""}`.trim() });
  const lines = text.split("\n");
  const long = text.length > FOLD_CHARS || lines.length > FOLD_LINES;
  if (!long) {
    pre.textContent = text;
    return pre;
  }
  const head = lines.slice(0, FOLD_LINES).join("\n").slice(0, FOLD_CHARS);
  const wrap = el("div", { class: "fold" });
  pre.textContent = head + " …";
  const button = el("button", { class: "unfold", type: "button" },
    `Show all (${lines.length.toLocaleString("en-US")} lines, ${text.length.toLocaleString("en-US")} chars)`);
  let open = false;
  button.addEventListener("click", () => {
    open = !open;
    pre.textContent = open ? text : head + " …";
    button.textContent = open ? "Fold" : `Show all (${lines.length.toLocaleString("en-US")} lines, ${text.length.toLocaleString("en-US")} chars)`;
  });
  wrap.append(pre, button);
  return wrap;
}

const LINE = 100;

// JSON on one line, spaced as a person writes it.
function flatJson(value) {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return "[" + value.map(flatJson).join(", ") + "]";
  return "{" + Object.entries(value).map(([key, v]) => JSON.stringify(key) + ": " + flatJson(v)).join(", ") + "}";
}

// JSON for reading: one item per line, but short containers and runs of numbers kept on one line
// (token ids and log-probs would otherwise take a line each).
function compactJson(value, indent) {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  const isArray = Array.isArray(value);
  const entries = isArray ? value.map((v) => [null, v]) : Object.entries(value);
  if (!entries.length) return isArray ? "[]" : "{}";
  if (JSON.stringify(value).length + indent.length <= LINE) { // cheap test first: most values are long
    const flat = flatJson(value);
    if (flat.length + indent.length <= LINE) return flat;
  }
  const inner = indent + "  ";
  if (isArray && value.every((v) => v === null || typeof v !== "object")) {
    const lines = [];
    let line = "";
    for (const v of value) {
      const text = JSON.stringify(v);
      if (line && line.length + text.length + 2 + inner.length > LINE) {
        lines.push(line + ",");
        line = "";
      }
      line += (line ? ", " : "") + text;
    }
    lines.push(line);
    return "[\n" + lines.map((l) => inner + l).join("\n") + "\n" + indent + "]";
  }
  const parts = entries.map(([key, v]) => inner + (isArray ? "" : JSON.stringify(key) + ": ") + compactJson(v, inner));
  return (isArray ? "[" : "{") + "\n" + parts.join(",\n") + "\n" + indent + (isArray ? "]" : "}");
}

export function pretty(value) {
  return typeof value === "string" ? value : compactJson(value, "");
}

// A string that holds JSON (tool arguments and outputs) is shown pretty-printed; anything else as is.
export function prettyText(text) {
  if (typeof text !== "string") return pretty(text);
  const trimmed = text.trim();
  if (trimmed.startsWith("{") || trimmed.startsWith("[")) {
    try {
      return compactJson(JSON.parse(trimmed), "");
    } catch (error) {
      return text;
    }
  }
  return text;
}

// A key/value table of any object: scalars as text, everything else as folded JSON.
export function kvTable(object, options = {}) {
  const table = el("table", { class: "kv" });
  const highlight = options.highlight || new Set();
  for (const [key, value] of Object.entries(object)) {
    const shown = value !== null && typeof value === "object" ? folded(pretty(value), "json") : el("span", { class: "scalar" }, value === null ? "null" : String(value));
    table.appendChild(el("tr", { class: highlight.has(key) ? "differs" : "" }, el("th", {}, key), el("td", {}, shown)));
  }
  return table;
}

// ---- an episode, as a person reads it --------------------------------------------------------

function contentText(content) {
  if (typeof content === "string") return [content];
  if (!Array.isArray(content)) return content === undefined || content === null ? [] : [pretty(content)];
  return content.map((part) => {
    if (part && typeof part === "object" && typeof part.text === "string") return part.text;
    if (part && typeof part === "object" && typeof part.refusal === "string") return `[refusal] ${part.refusal}`;
    return pretty(part);
  });
}

const TOKEN_FIELDS = ["prompt_token_ids", "generation_token_ids", "generation_log_probs"];

function tokenNote(item) {
  const parts = [];
  if (Array.isArray(item.prompt_token_ids)) parts.push(`prompt ${fmtCount(item.prompt_token_ids.length)} tokens`);
  if (Array.isArray(item.generation_token_ids)) parts.push(`generated ${fmtCount(item.generation_token_ids.length)} tokens`);
  if (Array.isArray(item.generation_log_probs)) parts.push(`${fmtCount(item.generation_log_probs.length)} log-probs`);
  return parts.length ? el("div", { class: "tokens" }, parts.join(" · ")) : null;
}

const KNOWN_KEYS = {
  message: ["type", "role", "content", "id", "status", ...TOKEN_FIELDS],
  reasoning: ["type", "summary", "content", "id", "status", "encrypted_content", ...TOKEN_FIELDS],
  function_call: ["type", "name", "arguments", "call_id", "id", "status", ...TOKEN_FIELDS],
  function_call_output: ["type", "call_id", "output", "id", "status"],
};

// Fields of an item this page does not lay out: shown as a table rather than hidden.
function extraFields(item, kind) {
  const known = KNOWN_KEYS[kind || item.type] || [];
  const extra = {};
  // null fields carry nothing (SDK models dump every optional field as null)
  for (const [key, value] of Object.entries(item)) if (!known.includes(key) && value !== null) extra[key] = value;
  return Object.keys(extra).length ? el("details", { class: "extra" }, el("summary", {}, "more fields"), kvTable(extra)) : null;
}

function messageBlock(item) {
  const role = typeof item.role === "string" ? item.role : "message";
  return el("div", { class: `item message role-${["system", "developer", "user", "assistant"].includes(role) ? role : "other"}` },
    el("div", { class: "label" }, role),
    contentText(item.content).map((text) => folded(text)),
    tokenNote(item), extraFields(item, "message"));
}

function reasoningBlock(item) {
  const texts = [];
  for (const key of ["summary", "content"]) {
    if (Array.isArray(item[key])) for (const part of item[key]) texts.push(part && typeof part.text === "string" ? part.text : pretty(part));
  }
  return el("details", { class: "item reasoning", open: true },
    el("summary", { class: "label" }, "reasoning"),
    texts.length ? texts.map((text) => folded(text)) : el("div", { class: "muted" }, "(no summary)"),
    tokenNote(item), extraFields(item));
}

export function callBlock(call, outputs) {
  let argumentsNote = null;
  if (typeof call.arguments === "string") {
    try {
      JSON.parse(call.arguments);
    } catch (error) {
      argumentsNote = el("div", { class: "warn" }, "arguments are not valid JSON");
    }
  }
  const outputCell = outputs.length
    ? outputs.map((out) => el("div", { class: "output" }, folded(prettyText(out.output), "json"), extraFields(out)))
    : el("div", { class: "muted" }, "(no output: the episode ended here)");
  return el("div", { class: "item call" },
    el("div", { class: "call-args" },
      el("div", { class: "label" }, "tool call ", el("code", { class: "tool-name" }, String(call.name)),
        el("span", { class: "call-id" }, String(call.call_id || ""))),
      argumentsNote, folded(prettyText(call.arguments), "json"), tokenNote(call), extraFields(call)),
    el("div", { class: "call-output" }, el("div", { class: "label" }, "output"), outputCell));
}

function genericBlock(item) {
  return el("div", { class: "item other" }, el("div", { class: "label" }, String(item && item.type ? item.type : "item")),
    item && typeof item === "object" ? kvTable(item) : folded(pretty(item)));
}

// Input items (the task) then output items (the episode); each call beside its output.
export function renderItems(items) {
  const outputsByCall = new Map();
  for (const item of items) {
    if (item && item.type === "function_call_output") {
      if (!outputsByCall.has(item.call_id)) outputsByCall.set(item.call_id, []);
      outputsByCall.get(item.call_id).push(item);
    }
  }
  const calls = new Set(items.filter((item) => item && item.type === "function_call").map((item) => item.call_id));
  const blocks = [];
  for (const item of items) {
    if (!item || typeof item !== "object") blocks.push(genericBlock(item));
    else if (item.type === "function_call") blocks.push(callBlock(item, outputsByCall.get(item.call_id) || []));
    else if (item.type === "function_call_output") {
      if (!calls.has(item.call_id)) blocks.push(genericBlock(item)); // an output of no call shown: keep it visible
    } else if (item.type === "reasoning") blocks.push(reasoningBlock(item));
    else if (item.type === "message" || (item.role && item.content !== undefined && !item.type)) blocks.push(messageBlock(item));
    else blocks.push(genericBlock(item));
  }
  return el("div", { class: "items" }, blocks);
}

export function inputItems(row) {
  const params = row && row.responses_create_params;
  const input = params ? params.input : undefined;
  if (typeof input === "string") return [{ type: "message", role: "user", content: input }];
  return Array.isArray(input) ? input : [];
}

export function outputItems(row) {
  const response = row && row.response;
  return response && Array.isArray(response.output) ? response.output : [];
}

export function toolsBlock(tools) {
  if (!Array.isArray(tools) || !tools.length) return null;
  return el("details", { class: "tools" }, el("summary", {}, `tools (${tools.length})`),
    tools.map((tool) => el("div", { class: "tool" },
      el("code", { class: "tool-name" }, String(tool && tool.name)),
      tool && tool.description ? el("div", { class: "muted" }, String(tool.description)) : null,
      folded(pretty(tool && tool.parameters !== undefined ? tool.parameters : tool), "json"))));
}

// The verify reply beyond the task and the episode: reward first, then why, then everything else.
export const ROW_KEYS = new Set(["responses_create_params", "response", "reward", "_ng_task_index", "_ng_rollout_index", "agent_ref"]);
const FIRST = ["failure_kind", "failure_reason", "_ng_failure_class", "reward_components", "mask_sample"];

export function verifyFields(row) {
  const extra = {};
  for (const key of FIRST) if (row && key in row) extra[key] = row[key];
  for (const [key, value] of Object.entries(row || {})) if (!ROW_KEYS.has(key) && !(key in extra)) extra[key] = value;
  return extra;
}

export function verifyBlock(row, options = {}) {
  const extra = verifyFields(row);
  return el("section", { class: "verify" },
    el("div", { class: "verdict" }, el("span", { class: "label" }, "reward"), rewardBadge(row ? row.reward : null, "big"),
      row && row.failure_reason ? el("span", { class: "failure" }, String(row.failure_reason)) : null),
    Object.keys(extra).length ? kvTable(extra, options) : el("div", { class: "muted" }, "the verify reply has no other field"));
}
