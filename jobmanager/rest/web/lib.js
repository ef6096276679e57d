// Weir web UI: DOM helpers, formatting and the REST client. Plain ES module, no dependencies.

const SVG_NS = "http://www.w3.org/2000/svg";

function applyAttrs(node, attrs) {
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(node.dataset, value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function appendChildren(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** An HTML element: h("td", {class: "num"}, "12"). Text is always set as text, never parsed. */
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  applyAttrs(node, attrs);
  appendChildren(node, children);
  return node;
}

/** An SVG element, same calling convention as h(). */
export function s(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  applyAttrs(node, attrs);
  appendChildren(node, children);
  return node;
}

// Formatting ------------------------------------------------------------------------------------

const pad = (n, width = 2) => String(n).padStart(width, "0");

/** Epoch ms -> "2025-11-24 16:02:11" in the browser's time zone; "—" for none. */
export function fmtTime(ms) {
  if (ms === null || ms === undefined || ms <= 0) return "—";
  const d = new Date(ms);
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
  );
}

/** Epoch ms -> "16:02:11.042". */
export function fmtClock(ms) {
  if (ms === null || ms === undefined || ms <= 0) return "—";
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** A duration in ms -> "850 ms", "12.3 s", "4m 05s", "2h 03m". */
export function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  const total = Math.floor(ms / 1000);
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const seconds = total % 60;
  if (hours > 0) return `${hours}h ${pad(minutes)}m`;
  return `${minutes}m ${pad(seconds)}s`;
}

/** Bytes -> "1.2 MiB". */
export function fmtBytes(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`;
}

/** A count -> "1,234,567". */
export function fmtCount(n) {
  if (n === null || n === undefined) return "—";
  return Number(n).toLocaleString("en-US");
}

/** A rate per second -> "12.3k/s". */
export function fmtRate(perSecond) {
  if (perSecond === null || perSecond === undefined || !Number.isFinite(perSecond)) return "";
  if (perSecond >= 1_000_000) return `${(perSecond / 1_000_000).toFixed(1)}M/s`;
  if (perSecond >= 1000) return `${(perSecond / 1000).toFixed(1)}k/s`;
  return `${Math.round(perSecond)}/s`;
}

/** A ratio 0..1 -> "35%"; "—" for none. */
export function fmtRatio(ratio) {
  if (ratio === null || ratio === undefined) return "—";
  return `${Math.round(ratio * 100)}%`;
}

/** Flink's backpressure level of a ratio: <= 0.10 ok, <= 0.5 low, else high; "none" without data. */
export function backpressureLevel(ratio) {
  if (ratio === null || ratio === undefined) return "none";
  if (ratio <= 0.1) return "ok";
  if (ratio <= 0.5) return "low";
  return "high";
}

/** The largest of the non-null values, or null when there is none. */
export function maxOf(values) {
  let best = null;
  for (const v of values) {
    if (v === null || v === undefined) continue;
    if (best === null || v > best) best = v;
  }
  return best;
}

/** A status badge; its colour comes from the status name (app.css .status-*). */
export function statusBadge(status, testid) {
  if (status === null || status === undefined) return h("span", { class: "badge", "data-testid": testid }, "not reported");
  const name = String(status);
  return h("span", { class: `badge status-${name.toLowerCase()}`, "data-testid": testid }, name);
}

// REST client -----------------------------------------------------------------------------------

/** An API answer other than 2xx, or no answer at all (status 0). */
export class ApiError extends Error {
  constructor(path, status, messages) {
    super(`GET ${path}: ${status === 0 ? "no answer" : `HTTP ${status}`}: ${messages.join("; ")}`);
    this.path = path;
    this.status = status;
    this.messages = messages;
  }
}

const TOKEN_KEY = "weir-token";

/** The cluster's bearer token the user gave this tab (WEIR_AUTH_TOKEN), or null. */
export function storedToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Keep ``token`` for this tab's API calls (an empty one forgets it). */
export function storeToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** GET a path of the REST API (relative to the page, so a path prefix in front of Weir works),
 * with the tab's bearer token when it has one. */
export async function getJSON(path) {
  let response;
  const headers = { Accept: "application/json" };
  const token = storedToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  try {
    response = await fetch(path.replace(/^\//, ""), { cache: "no-store", headers });
  } catch (error) {
    throw new ApiError(path, 0, [String(error?.message ?? error)]);
  }
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const messages =
      body && Array.isArray(body.errors) ? body.errors.map(String) : [text.slice(0, 300) || response.statusText];
    throw new ApiError(path, response.status, messages);
  }
  if (body === null) throw new ApiError(path, response.status, ["the answer is not JSON"]);
  return body;
}
