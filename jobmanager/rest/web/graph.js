// Weir web UI: the job graph as SVG, laid out left to right by topological depth.
// Nodes are the plan's vertices (chained operators, parallelism); edges carry the ship strategy.
// Live figures come from GET /jobs/{id}: records in/out with a rate, the max busy and
// backpressured ratio of the vertex's subtasks (the node's colour, Flink's levels) and the max
// watermark lag.

import { backpressureLevel, fmtCount, fmtDuration, fmtRate, fmtRatio, maxOf, s } from "./lib.js";

const NODE_W = 270;
const COL_GAP = 190;
const ROW_GAP = 36;
const MARGIN = 24;
const LINE = 17;
const CHAR_W = 7.0; // average glyph width of 12 px sans-serif, for truncation

/** depth(node) = 0 for a node without (known) inputs, else 1 + the deepest input. */
export function layerOf(nodes) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const depth = new Map();
  const visiting = new Set();
  const visit = (node) => {
    if (depth.has(node.id)) return depth.get(node.id);
    if (visiting.has(node.id)) return 0; // a cycle cannot come from a plan; do not loop on one
    visiting.add(node.id);
    let d = 0;
    for (const input of node.inputs ?? []) {
      const producer = byId.get(input.id);
      if (producer) d = Math.max(d, visit(producer) + 1);
    }
    visiting.delete(node.id);
    depth.set(node.id, d);
    return d;
  };
  nodes.forEach(visit);
  return depth;
}

function truncate(text, width) {
  const max = Math.max(4, Math.floor(width / CHAR_W));
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

/** The figures drawn in a node, from the job's vertex (or nulls without one). */
export function vertexFigures(vertex, rates) {
  const subtasks = vertex?.subtasks ?? [];
  return {
    readRecords: vertex?.metrics?.["read-records"] ?? null,
    writeRecords: vertex?.metrics?.["write-records"] ?? null,
    readRate: rates?.read ?? null,
    writeRate: rates?.write ?? null,
    busy: maxOf(subtasks.map((t) => t.busyRatio)),
    backpressured: maxOf(subtasks.map((t) => t.backPressuredRatio)),
    watermarkLag: maxOf(subtasks.map((t) => t.watermark_lag)),
    status: vertex?.status ?? null,
  };
}

function nodeHeight(node) {
  const chainLines = Math.max(0, (node.operators ?? []).length - 1);
  return 30 + chainLines * LINE + 4 * LINE + 10;
}

/** Positions of the nodes: x by depth, y stacked per column, columns centred vertically. */
export function layout(nodes) {
  const depth = layerOf(nodes);
  const columns = [];
  for (const node of nodes) {
    const d = depth.get(node.id);
    (columns[d] ??= []).push(node);
  }
  const heights = columns.map((col) => col.reduce((sum, n) => sum + nodeHeight(n), 0) + ROW_GAP * (col.length - 1));
  const tallest = Math.max(0, ...heights);
  const boxes = new Map();
  columns.forEach((col, d) => {
    let y = MARGIN + 22 + (tallest - heights[d]) / 2;
    for (const node of col) {
      const height = nodeHeight(node);
      boxes.set(node.id, { x: MARGIN + d * (NODE_W + COL_GAP), y, w: NODE_W, h: height });
      y += height + ROW_GAP;
    }
  });
  return {
    boxes,
    width: MARGIN * 2 + Math.max(1, columns.length) * NODE_W + Math.max(0, columns.length - 1) * COL_GAP,
    height: MARGIN * 2 + 22 + tallest,
  };
}

function edgeElements(plan, boxes, onTip) {
  const out = [];
  for (const node of plan.nodes) {
    const target = boxes.get(node.id);
    const inputs = node.inputs ?? [];
    inputs.forEach((input, i) => {
      const source = boxes.get(input.id);
      if (!source || !target) return;
      const x1 = source.x + source.w;
      const y1 = source.y + source.h / 2;
      const x2 = target.x;
      const y2 = target.y + (target.h * (i + 1)) / (inputs.length + 1);
      const dx = Math.max(40, (x2 - x1) / 2);
      const strategy = String(input.ship_strategy ?? "?");
      const label = input.side_output ? `${strategy} [${input.side_output}]` : strategy;
      const mx = (x1 + x2) / 2;
      const my = (y1 + y2) / 2;
      const labelW = label.length * 6.6 + 12;
      const tip = `${plan.nodes.find((n) => n.id === input.id)?.uid ?? input.id} → ${node.uid ?? node.id}\n${label} (input ${input.num})`;
      out.push(
        s(
          "g",
          {
            class: `edge edge-${strategy.toLowerCase()}`,
            "data-testid": "graph-edge",
            "data-source": input.id,
            "data-target": node.id,
            "data-ship-strategy": strategy,
            "data-tip": onTip ? tip : null,
          },
          s("path", {
            d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`,
            class: "edge-line",
            "marker-end": "url(#arrow)",
          }),
          s("rect", { x: mx - labelW / 2, y: my - 10, width: labelW, height: 20, rx: 10, class: "edge-label-bg" }),
          s("text", { x: mx, y: my + 4, "text-anchor": "middle", class: "edge-label" }, label),
        ),
      );
    });
  }
  return out;
}

function nodeElement(node, box, figures, onSelect) {
  const level = backpressureLevel(figures.backpressured);
  const inner = box.w - 20;
  const operators = node.operators ?? [];
  const head = operators[0]?.name ?? node.operator ?? node.id;
  const lines = [];
  let y = box.y + 22;
  lines.push(s("text", { x: box.x + 12, y, class: "node-title" }, truncate(head, inner - 46)));
  lines.push(
    s(
      "text",
      { x: box.x + box.w - 10, y, "text-anchor": "end", class: "node-parallelism", "data-testid": "node-parallelism" },
      `P=${node.parallelism}`,
    ),
  );
  for (const op of operators.slice(1)) {
    y += LINE;
    lines.push(s("text", { x: box.x + 12, y, class: "node-chain" }, truncate(`↳ ${op.name}`, inner)));
  }
  const rateText = (r) => (r === null ? "" : `  ·  ${fmtRate(r)}`);
  const rows = [
    ["in", `${fmtCount(figures.readRecords)}${rateText(figures.readRate)}`, "node-records-in"],
    ["out", `${fmtCount(figures.writeRecords)}${rateText(figures.writeRate)}`, "node-records-out"],
    ["busy / backpressured", `${fmtRatio(figures.busy)} / ${fmtRatio(figures.backpressured)}`, "node-ratios"],
    ["watermark lag", figures.watermarkLag === null ? "—" : fmtDuration(figures.watermarkLag), "node-watermark-lag"],
  ];
  y += 8;
  for (const [name, value, testid] of rows) {
    y += LINE;
    lines.push(s("text", { x: box.x + 12, y, class: "node-metric-name" }, name));
    lines.push(
      s("text", { x: box.x + box.w - 10, y, "text-anchor": "end", class: "node-metric", "data-testid": testid }, value),
    );
  }
  const tip = [
    node.description ?? head,
    `vertex ${node.uid ?? node.id}, parallelism ${node.parallelism}${figures.status ? `, ${figures.status}` : ""}`,
    `max busy ${fmtRatio(figures.busy)}, max backpressured ${fmtRatio(figures.backpressured)} (${level})`,
  ].join("\n");
  return s(
    "g",
    {
      class: `node bp-${level}`,
      "data-testid": "graph-node",
      "data-vertex-id": node.id,
      "data-backpressure": level,
      "data-tip": tip,
      onclick: () => onSelect?.(node.id),
    },
    s("rect", { x: box.x, y: box.y, width: box.w, height: box.h, rx: 8, class: "node-box" }),
    s("rect", { x: box.x, y: box.y, width: 6, height: box.h, rx: 3, class: "node-stripe" }),
    lines,
  );
}

/** The SVG of a plan, with the live figures of each vertex (figuresById: id -> vertexFigures). */
export function renderGraph(plan, figuresById, onSelect) {
  const { boxes, width, height } = layout(plan.nodes);
  return s(
    "svg",
    {
      class: "job-graph",
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      "data-testid": "job-graph",
      role: "img",
      "aria-label": `job graph of ${plan.name ?? plan.jid}`,
    },
    s(
      "defs",
      null,
      s(
        "marker",
        { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
        s("path", { d: "M0,0 L10,5 L0,10 z", class: "edge-arrow" }),
      ),
    ),
    edgeElements(plan, boxes, true),
    plan.nodes.map((node) => nodeElement(node, boxes.get(node.id), figuresById.get(node.id) ?? vertexFigures(null), onSelect)),
  );
}
