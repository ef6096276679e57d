// Weir web UI: one checkpoint's timeline, per subtask (grouped by vertex), from the trigger:
//   start delay  trigger -> first barrier
//   alignment    first barrier -> alignment end (a tick per input channel's barrier arrival)
//   sync         alignment end -> synchronous part of the snapshot done
//   async        sync end -> upload done
//   ack delay    upload done -> the acknowledgement reached the JobManager
// A subtask without a timeline (timeline: null) is drawn from its durations, and labelled so.

import { fmtDuration, h, s } from "./lib.js";

export const SEGMENTS = [
  { kind: "start_delay", label: "start delay (trigger → first barrier)" },
  { kind: "alignment", label: "alignment (first barrier → last)" },
  { kind: "sync", label: "sync snapshot" },
  { kind: "async", label: "async upload" },
  { kind: "ack", label: "ack delay (upload → JobManager)" },
];
const LABEL = new Map(SEGMENTS.map((seg) => [seg.kind, seg.label]));

const LABEL_W = 250;
const RIGHT_PAD = 70;
const AXIS_H = 30;
const GROUP_H = 26;
const ROW_H = 24;
const BAR_H = 12;

const rel = (ts, t0) => (ts === null || ts === undefined ? null : ts - t0);

/**
 * The drawing model of one subtask, times relative to t0 (the checkpoint's trigger):
 * {source: "timeline"|"durations", segments: [{kind, kinds, from, to}], ticks: [...], end, asyncMs}.
 */
export function subtaskModel(subtask, t0) {
  const tl = subtask.timeline;
  if (tl) {
    const points = [
      ["start_delay", rel(tl.first_barrier_timestamp, t0)],
      ["alignment", rel(tl.alignment_end_timestamp, t0)],
      ["sync", rel(tl.sync_end_timestamp, t0)],
      ["async", rel(tl.async_end_timestamp, t0)],
      ["ack", rel(tl.ack_timestamp ?? subtask.ack_timestamp, t0)],
    ];
    const segments = [];
    let prev = rel(tl.trigger_timestamp, t0) ?? 0;
    let skipped = [];
    for (const [kind, at] of points) {
      if (at === null) {
        skipped.push(kind);
        continue;
      }
      segments.push({ kind, kinds: [...skipped, kind], from: prev, to: Math.max(prev, at) });
      prev = Math.max(prev, at);
      skipped = [];
    }
    const first = tl.first_barrier_timestamp;
    const ticks = (tl.channels ?? [])
      .filter((c) => c.barrier_timestamp !== null && c.barrier_timestamp !== undefined)
      .map((c) => ({
        channel: c.channel,
        upstreamVertex: c.upstream_vertex,
        upstreamSubtask: c.upstream_subtask,
        at: c.barrier_timestamp - t0,
        sinceFirst: first === null || first === undefined ? null : c.barrier_timestamp - first,
      }));
    const syncEnd = tl.sync_end_timestamp;
    const asyncEnd = tl.async_end_timestamp;
    const asyncMs = syncEnd !== null && asyncEnd !== null && asyncEnd !== undefined ? asyncEnd - syncEnd : null;
    return { source: "timeline", segments, ticks, end: prev, asyncMs };
  }
  const durations = [
    ["start_delay", subtask.start_delay],
    ["alignment", subtask.alignment_duration],
    ["sync", subtask.sync_duration],
    ["async", subtask.async_duration],
  ];
  const segments = [];
  let at = 0;
  for (const [kind, ms] of durations) {
    const d = Math.max(0, ms ?? 0);
    segments.push({ kind, kinds: [kind], from: at, to: at + d });
    at += d;
  }
  const ack = rel(subtask.ack_timestamp, t0);
  if (ack !== null && ack > at) {
    segments.push({ kind: "ack", kinds: ["ack"], from: at, to: ack });
    at = ack;
  }
  return { source: "durations", segments, ticks: [], end: at, asyncMs: subtask.async_duration ?? null };
}

/** The slowest channel (latest barrier behind its subtask's first one) and the slowest upload. */
export function slowest(rows) {
  let channel = null;
  let upload = null;
  for (const row of rows) {
    for (const tick of row.model.ticks) {
      if (tick.sinceFirst !== null && tick.sinceFirst > 0 && (channel === null || tick.sinceFirst > channel.tick.sinceFirst)) {
        channel = { row, tick };
      }
    }
    const ms = row.model.asyncMs;
    if (ms !== null && ms > 0 && (upload === null || ms > upload.ms)) upload = { row, ms };
  }
  return { channel, upload };
}

/** A "nice" axis step (1, 2 or 5 times a power of ten) giving about `count` ticks over `span`. */
export function niceStep(span, count = 8) {
  const raw = Math.max(span, 1) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

/**
 * Rows of a checkpoint's subtasks, grouped by vertex in the order of `vertices`
 * ([{id, name}]; vertices not listed come after, by id).
 */
export function timelineRows(details, vertices) {
  const order = new Map(vertices.map((v, i) => [v.uid ?? v.id, i]));
  const t0 = details.trigger_timestamp;
  const rows = (details.subtasks ?? []).map((st) => ({ subtask: st, model: subtaskModel(st, t0) }));
  rows.sort((a, b) => {
    const oa = order.get(a.subtask.vertex_id) ?? Number.MAX_SAFE_INTEGER;
    const ob = order.get(b.subtask.vertex_id) ?? Number.MAX_SAFE_INTEGER;
    if (oa !== ob) return oa - ob;
    if (a.subtask.vertex_id !== b.subtask.vertex_id) return a.subtask.vertex_id < b.subtask.vertex_id ? -1 : 1;
    return a.subtask.subtask - b.subtask.subtask;
  });
  return rows;
}

const sign = (ms) => `+${fmtDuration(ms)}`;

/** The timeline SVG of `rows` (from timelineRows), `width` px wide. */
export function renderTimeline(rows, vertexNames, width) {
  const { channel, upload } = slowest(rows);
  const span = Math.max(1, ...rows.map((r) => r.model.end), ...rows.flatMap((r) => r.model.ticks.map((t) => t.at)));
  const barW = Math.max(200, width - LABEL_W - RIGHT_PAD);
  const x = (ms) => LABEL_W + (Math.max(0, ms) / span) * barW;
  const nameOf = (id) => vertexNames.get(id) ?? id;

  const groups = [];
  for (const row of rows) {
    const last = groups[groups.length - 1];
    if (last && last.vertexId === row.subtask.vertex_id) last.rows.push(row);
    else groups.push({ vertexId: row.subtask.vertex_id, rows: [row] });
  }
  const height = AXIS_H + groups.length * GROUP_H + rows.length * ROW_H + 10;

  const step = niceStep(span);
  const axis = [s("line", { x1: LABEL_W, x2: LABEL_W + barW, y1: AXIS_H - 6, y2: AXIS_H - 6, class: "axis-line" })];
  for (let t = 0; t <= span + step / 1000; t += step) {
    axis.push(s("line", { x1: x(t), x2: x(t), y1: AXIS_H - 10, y2: height, class: "axis-grid" }));
    axis.push(s("text", { x: x(t), y: AXIS_H - 14, "text-anchor": "middle", class: "axis-label" }, `${Math.round(t)} ms`));
  }

  const body = [];
  let y = AXIS_H;
  for (const group of groups) {
    body.push(
      s(
        "text",
        { x: 8, y: y + 18, class: "timeline-group", "data-testid": "timeline-group", "data-vertex-id": group.vertexId },
        nameOf(group.vertexId),
      ),
    );
    y += GROUP_H;
    for (const row of group.rows) {
      const st = row.subtask;
      const fromDurations = row.model.source === "durations";
      const cy = y + ROW_H / 2;
      const parts = [
        s("rect", { x: 0, y, width: LABEL_W + barW + RIGHT_PAD, height: ROW_H, class: "timeline-row-bg" }),
        s(
          "text",
          { x: 22, y: cy + 4, class: "timeline-label" },
          `subtask ${st.subtask}`,
          st.status && st.status !== "COMPLETED" ? ` · ${st.status.toLowerCase()}` : "",
        ),
      ];
      if (fromDurations) {
        parts.push(
          s(
            "text",
            { x: LABEL_W - 10, y: cy + 4, "text-anchor": "end", class: "timeline-from-durations", "data-testid": "from-durations" },
            "from durations",
          ),
        );
      }
      for (const seg of row.model.segments) {
        const ms = seg.to - seg.from;
        if (ms <= 0) continue;
        const isSlowUpload = upload && upload.row === row && seg.kind === "async";
        const what = seg.kinds.map((k) => LABEL.get(k)).join(" + ");
        parts.push(
          s("rect", {
            x: x(seg.from),
            y: cy - BAR_H / 2,
            width: Math.max(1, x(seg.to) - x(seg.from)),
            height: BAR_H,
            class: `seg seg-${seg.kind}${fromDurations ? " seg-derived" : ""}${isSlowUpload ? " slowest-upload" : ""}`,
            "data-testid": "timeline-segment",
            "data-kind": seg.kind,
            "data-tip":
              `${nameOf(st.vertex_id)} · subtask ${st.subtask}\n${what}: ${fmtDuration(ms)}` +
              `\n${sign(seg.from)} → ${sign(seg.to)} after the trigger` +
              (fromDurations ? "\n(no timeline recorded: drawn from the subtask's durations)" : "") +
              (isSlowUpload ? "\nslowest upload of this checkpoint" : ""),
          }),
        );
      }
      for (const tick of row.model.ticks) {
        const isSlowest = channel && channel.row === row && channel.tick === tick;
        const tx = x(tick.at);
        parts.push(
          s("line", {
            x1: tx,
            x2: tx,
            y1: cy - BAR_H / 2 - 4,
            y2: cy + BAR_H / 2 + 4,
            class: `tick${isSlowest ? " slowest-channel" : ""}`,
          }),
          // a wider transparent target, so a 2 px tick is easy to hover
          s("rect", {
            x: tx - 4,
            y: cy - BAR_H / 2 - 4,
            width: 8,
            height: BAR_H + 8,
            class: "tick-target",
            "data-testid": "timeline-channel-tick",
            "data-channel": tick.channel,
            "data-tip":
              `${nameOf(st.vertex_id)} · subtask ${st.subtask}\n` +
              `barrier on channel ${tick.channel} from ${nameOf(tick.upstreamVertex)} subtask ${tick.upstreamSubtask}\n` +
              `${sign(tick.at)} after the trigger` +
              (tick.sinceFirst === null ? "" : `, ${sign(tick.sinceFirst)} after the first barrier`) +
              (isSlowest ? "\nslowest channel of this checkpoint" : ""),
          }),
        );
      }
      const endX = x(row.model.end);
      parts.push(s("text", { x: endX + 6, y: cy + 4, class: "timeline-end" }, fmtDuration(row.model.end)));
      body.push(
        s(
          "g",
          {
            class: "timeline-row",
            "data-testid": "timeline-row",
            "data-vertex-id": st.vertex_id,
            "data-subtask": st.subtask,
            "data-source": row.model.source,
          },
          parts,
        ),
      );
      y += ROW_H;
    }
  }
  const svg = s(
    "svg",
    { class: "checkpoint-timeline", width: LABEL_W + barW + RIGHT_PAD, height, "data-testid": "checkpoint-timeline" },
    axis,
    body,
  );
  return { svg, channel, upload };
}

/** The legend: a swatch per segment kind and mark, with its label. */
export function renderLegend() {
  const items = [
    ...SEGMENTS.map((seg) => [s("rect", { width: 14, height: 10, y: 2, class: `seg seg-${seg.kind}` }), seg.label]),
    [s("line", { x1: 7, x2: 7, y1: 0, y2: 14, class: "tick" }), "barrier on an input channel"],
    [s("line", { x1: 7, x2: 7, y1: 0, y2: 14, class: "tick slowest-channel" }), "slowest channel"],
    [s("rect", { width: 14, height: 10, y: 2, class: "seg seg-async slowest-upload" }), "slowest upload"],
    [s("rect", { width: 14, height: 10, y: 2, class: "seg seg-sync seg-derived" }), "from durations (no timeline)"],
  ];
  return h(
    "div",
    { class: "legend", "data-testid": "timeline-legend" },
    items.map(([swatch, label]) =>
      h("span", { class: "legend-item" }, s("svg", { width: 14, height: 14, class: "legend-swatch" }, swatch), label),
    ),
  );
}
