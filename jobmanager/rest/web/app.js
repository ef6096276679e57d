// Weir web UI: a hash-routed single-page app over the JobManager's REST API (docs/ui.md).
// Every view loads its data, renders it, and polls again every POLL_MS; an API error is shown in
// the header's banner and the last good data stays on screen.
//
//   #/                                  overview: TaskManagers, slots, jobs
//   #/taskmanagers                      each TaskManager with its slots and tasks
//   #/jobs/{id}                         the job graph with live figures, a subtask table per vertex
//   #/jobs/{id}/checkpoints             counts, latest, history
//   #/jobs/{id}/checkpoints/{cid}       one checkpoint's timeline
//   #/jobs/{id}/exceptions              the exception history

import { layout, renderGraph, vertexFigures } from "./graph.js";
import {
  ApiError,
  backpressureLevel,
  fmtBytes,
  fmtClock,
  fmtCount,
  fmtDuration,
  fmtRatio,
  fmtTime,
  getJSON,
  h,
  statusBadge,
  storedToken,
  storeToken,
} from "./lib.js";
import { renderLegend, renderTimeline, timelineRows } from "./timeline.js";

const POLL_MS = 2000;

const state = {
  gen: 0, // bumped on every route change: an answer for an older route is dropped
  timer: null,
  key: null, // JSON of the data last rendered: an unchanged answer is not drawn again
  paused: false,
  needsToken: false, // the API answered 401: polling waits for the user's token
  plans: new Map(), // job id -> plan (a job's plan never changes)
  samples: new Map(), // job id -> {now, counts: Map(vertex id -> {read, write})}, for rates
};

const main = () => document.getElementById("main");

// Routing ---------------------------------------------------------------------------------------

function parseRoute(hash) {
  const parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts.length === 0) return { view: "overview" };
  if (parts[0] === "taskmanagers" && parts.length === 1) return { view: "taskmanagers" };
  if (parts[0] === "jobs" && parts.length >= 2) {
    const job = parts[1];
    if (parts.length === 2) return { view: "graph", job };
    if (parts[2] === "checkpoints" && parts.length === 3) return { view: "checkpoints", job };
    if (parts[2] === "checkpoints" && parts.length === 4) return { view: "checkpoint", job, checkpoint: parts[3] };
    if (parts[2] === "exceptions" && parts.length === 3) return { view: "exceptions", job };
  }
  return { view: "notfound", hash };
}

const jobPath = (job) => `/jobs/${encodeURIComponent(job)}`;
const jobLink = (job, tail = "") => `#/jobs/${encodeURIComponent(job)}${tail}`;

// Views: load(route) -> data, render(data, route) -> Node ------------------------------------------

async function loadJob(job) {
  const details = await getJSON(jobPath(job));
  return details;
}

const VIEWS = {
  overview: {
    title: () => "Overview",
    async load() {
      const [overview, jobs, tms] = await Promise.all([getJSON("/overview"), getJSON("/jobs"), getJSON("/taskmanagers")]);
      return { overview, jobs: jobs.jobs, taskmanagers: tms.taskmanagers };
    },
    render: renderOverview,
  },
  taskmanagers: {
    title: () => "TaskManagers",
    async load() {
      const [tms, jobs] = await Promise.all([getJSON("/taskmanagers"), getJSON("/jobs")]);
      const jobIds = [...new Set(tms.taskmanagers.flatMap((tm) => (tm.tasks ?? []).map((t) => t.job_id)))];
      const details = await Promise.allSettled(jobIds.map((id) => loadJob(id)));
      const vertexNames = {};
      details.forEach((d) => {
        if (d.status !== "fulfilled") return;
        for (const v of d.value.vertices ?? []) vertexNames[`${d.value.jid}/${v.uid ?? v.id}`] = v.name;
      });
      return { taskmanagers: tms.taskmanagers, jobs: jobs.jobs, vertexNames };
    },
    render: renderTaskManagers,
  },
  graph: {
    title: (r) => `Job ${r.job}`,
    async load(r) {
      let plan = state.plans.get(r.job);
      const [job, fetchedPlan] = await Promise.all([loadJob(r.job), plan ? null : getJSON(`${jobPath(r.job)}/plan`)]);
      if (!plan) {
        plan = fetchedPlan.plan;
        state.plans.set(r.job, plan);
      }
      return { job, plan, rates: ratesOf(r.job, job) };
    },
    render: renderGraphView,
  },
  checkpoints: {
    title: (r) => `Checkpoints of ${r.job}`,
    async load(r) {
      const [job, checkpoints] = await Promise.all([loadJob(r.job), getJSON(`${jobPath(r.job)}/checkpoints`)]);
      return { job, checkpoints };
    },
    render: renderCheckpoints,
  },
  checkpoint: {
    title: (r) => `Checkpoint ${r.checkpoint} of ${r.job}`,
    async load(r) {
      const path = `${jobPath(r.job)}/checkpoints/details/${encodeURIComponent(r.checkpoint)}`;
      const [job, details] = await Promise.all([loadJob(r.job), getJSON(path)]);
      return { job, details };
    },
    render: renderCheckpointDetails,
  },
  exceptions: {
    title: (r) => `Exceptions of ${r.job}`,
    async load(r) {
      const [job, exceptions] = await Promise.all([
        loadJob(r.job),
        getJSON(`${jobPath(r.job)}/exceptions?maxExceptions=100`),
      ]);
      return { job, exceptions: exceptions.exceptionHistory };
    },
    render: renderExceptions,
  },
  notfound: {
    title: () => "Not found",
    async load(r) {
      return { hash: r.hash };
    },
    render: (d) =>
      h(
        "section",
        { class: "panel", "data-testid": "not-found" },
        h("h2", null, "No such page"),
        h("p", null, `Nothing is shown at ${d.hash}. `, h("a", { href: "#/" }, "Back to the overview")),
      ),
  },
};

/** Records per second of each vertex since the previous answer for the same job. */
function ratesOf(jobId, job) {
  const counts = new Map(
    (job.vertices ?? []).map((v) => [v.id, { read: v.metrics?.["read-records"], write: v.metrics?.["write-records"] }]),
  );
  const previous = state.samples.get(jobId);
  state.samples.set(jobId, { now: job.now, counts });
  const rates = {};
  if (!previous || !(job.now > previous.now)) return rates;
  const seconds = (job.now - previous.now) / 1000;
  for (const [id, c] of counts) {
    const p = previous.counts.get(id);
    if (!p) continue;
    const rate = (a, b) => (a === undefined || b === undefined || a < b ? null : (a - b) / seconds);
    rates[id] = { read: rate(c.read, p.read), write: rate(c.write, p.write) };
  }
  return rates;
}

// Common pieces ---------------------------------------------------------------------------------

function table(testid, headers, rows, attrs = {}) {
  return h(
    "table",
    { class: "data", "data-testid": testid, ...attrs },
    h("thead", null, h("tr", null, headers.map((name) => h("th", null, name)))),
    h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: headers.length, class: "empty" }, "none"))),
  );
}

const num = (value, attrs = {}) => h("td", { class: "num", ...attrs }, value);
const mono = (value) => h("td", { class: "mono" }, value);

function card(label, value, testid) {
  return h("div", { class: "card", "data-testid": testid }, h("div", { class: "card-value" }, value), h("div", { class: "card-label" }, label));
}

function failureBox(failure, title = "Failure") {
  if (!failure) return null;
  return h(
    "div",
    { class: "failure", "data-testid": "job-failure" },
    h("strong", null, `${title}: ${failure.type}`),
    h("span", { class: `badge fault-${String(failure.fault).toLowerCase()}` }, failure.fault),
    h("span", { class: "badge" }, failure.retriable ? "retriable" : "not retriable"),
    h("pre", null, failure.message),
  );
}

/** The job's tasks per state: its vertices' counts per Flink ExecutionState, summed. */
function taskCounts(vertices) {
  const counts = {};
  for (const vertex of vertices) {
    for (const [state, n] of Object.entries(vertex.tasks ?? {})) counts[state] = (counts[state] ?? 0) + n;
  }
  return counts;
}

function jobDuration(job) {
  if (job.duration !== undefined && job.duration !== null) return job.duration;
  const end = job["end-time"];
  if (end && end > 0) return end - job["start-time"];
  if (["RUNNING", "RESTARTING", "CREATED", "CANCELLING"].includes(job.status)) return Date.now() - job["start-time"];
  return null;
}

function jobHeader(job, active) {
  const tab = (name, label, tail) =>
    h("a", { href: jobLink(job.jid, tail), class: name === active ? "tab active" : "tab", "data-testid": `tab-${name}` }, label);
  return h(
    "section",
    { class: "job-header", "data-testid": "job-header" },
    h(
      "div",
      { class: "job-title" },
      h("h2", { "data-testid": "job-name" }, job.name),
      statusBadge(job.state, "job-state"),
      h("span", { class: "mono muted" }, job.jid),
    ),
    h(
      "dl",
      { class: "facts" },
      fact("started", fmtTime(job["start-time"])),
      job["end-time"] > 0 ? fact("ended", fmtTime(job["end-time"])) : null,
      fact("duration", fmtDuration(job.duration)),
      fact("parallelism", job.parallelism),
      fact("restarts", job.restarts),
      fact("last completed checkpoint", job.last_completed_checkpoint ?? "—"),
      fact(
        "tasks",
        Object.entries(taskCounts(job.vertices ?? []))
          .filter(([, n]) => n > 0)
          .map(([name, n]) => `${n} ${name}`)
          .join(", ") || "—",
      ),
    ),
    failureBox(job.failure, "Last failure"),
    h(
      "nav",
      { class: "tabs" },
      tab("graph", "Graph", ""),
      tab("checkpoints", "Checkpoints", "/checkpoints"),
      tab("exceptions", "Exceptions", "/exceptions"),
    ),
  );
}

function fact(name, value) {
  return h("div", { class: "fact" }, h("dt", null, name), h("dd", null, value));
}

// Overview --------------------------------------------------------------------------------------

function renderOverview({ overview, jobs, taskmanagers }) {
  const rows = jobs.map((job) =>
    h(
      "tr",
      { "data-testid": "job-row", "data-job-id": job.id, class: "clickable", onclick: () => (location.hash = jobLink(job.id)) },
      h("td", null, h("a", { href: jobLink(job.id), "data-testid": "job-link" }, job.name)),
      mono(job.id),
      h("td", null, statusBadge(job.status)),
      h("td", { class: "time" }, fmtTime(job["start-time"])),
      num(fmtDuration(jobDuration(job))),
      num(job.parallelism),
      num(job.restarts),
    ),
  );
  return h(
    "div",
    null,
    h(
      "section",
      { class: "cards", "data-testid": "overview-cards" },
      card("TaskManagers", overview.taskmanagers, "overview-taskmanagers"),
      card("slots total", overview["slots-total"], "overview-slots-total"),
      card("slots free", overview["slots-available"], "overview-slots-free"),
      card("jobs running", overview["jobs-running"], "overview-jobs-running"),
      card("finished", overview["jobs-finished"], "overview-jobs-finished"),
      card("cancelled", overview["jobs-cancelled"], "overview-jobs-cancelled"),
      card("failed", overview["jobs-failed"], "overview-jobs-failed"),
    ),
    h(
      "section",
      { class: "panel" },
      h("h2", null, "Jobs"),
      table("jobs-table", ["name", "id", "status", "start", "duration", "parallelism", "restarts"], rows),
    ),
    h(
      "section",
      { class: "panel" },
      h("h2", null, "TaskManagers ", h("a", { href: "#/taskmanagers", class: "small" }, "details")),
      taskManagerTable(taskmanagers),
    ),
  );
}

function taskManagerTable(taskmanagers) {
  const rows = taskmanagers.map((tm) =>
    h(
      "tr",
      { "data-testid": "taskmanager-row", "data-taskmanager-id": tm.id },
      mono(tm.id),
      mono(tm.path),
      h("td", null, statusBadge(tm.alive ? "ALIVE" : "LOST")),
      num(tm.slotsNumber),
      num(tm.freeSlots),
      num(fmtDuration(tm.timeSinceLastHeartbeat)),
      num((tm.tasks ?? []).length),
    ),
  );
  return table("taskmanagers-table", ["id", "address", "state", "slots", "free", "last heartbeat", "tasks"], rows);
}

// TaskManagers ----------------------------------------------------------------------------------

function renderTaskManagers({ taskmanagers, jobs, vertexNames }) {
  const jobNames = new Map(jobs.map((j) => [j.id, j.name]));
  const sections = taskmanagers.map((tm) =>
    h(
      "section",
      { class: "panel", "data-testid": "taskmanager", "data-taskmanager-id": tm.id },
      h(
        "div",
        { class: "job-title" },
        h("h2", null, tm.id),
        statusBadge(tm.alive ? "ALIVE" : "LOST"),
        h("span", { class: "mono muted" }, tm.path),
      ),
      h(
        "dl",
        { class: "facts" },
        fact("slots", tm.slotsNumber),
        fact("free slots", tm.freeSlots),
        fact("last heartbeat", `${fmtDuration(tm.timeSinceLastHeartbeat)} ago`),
        fact("tasks", (tm.tasks ?? []).length),
      ),
      table(
        "taskmanager-tasks",
        ["job", "vertex", "subtask", "attempt", "status"],
        (tm.tasks ?? []).map((t) =>
          h(
            "tr",
            { "data-testid": "taskmanager-task" },
            h("td", null, h("a", { href: jobLink(t.job_id) }, jobNames.get(t.job_id) ?? t.job_id)),
            h("td", null, vertexNames[`${t.job_id}/${t.vertex_id}`] ?? t.vertex_id),
            num(t.subtask),
            num(t.attempt),
            h("td", null, statusBadge(t.status)),
          ),
        ),
      ),
    ),
  );
  return h("div", null, sections.length ? sections : h("p", { class: "panel empty" }, "No TaskManager is registered."));
}

// Job graph -------------------------------------------------------------------------------------

function renderGraphView({ job, plan, rates }) {
  const vertices = new Map((job.vertices ?? []).map((v) => [v.id, v]));
  const figures = new Map(plan.nodes.map((n) => [n.id, vertexFigures(vertices.get(n.id), rates[n.id])]));
  const select = (vertexId) => {
    const target = document.querySelector(`[data-testid="vertex-section"][data-vertex-id="${CSS.escape(vertexId)}"]`);
    target?.scrollIntoView({ behavior: "smooth", block: "start" });
  };
  const { width } = layout(plan.nodes);
  const ordered = plan.nodes.map((n) => vertices.get(n.id)).filter(Boolean);
  const extra = (job.vertices ?? []).filter((v) => !plan.nodes.some((n) => n.id === v.id));
  return h(
    "div",
    null,
    jobHeader(job, "graph"),
    h(
      "section",
      { class: "panel" },
      h(
        "div",
        { class: "panel-head" },
        h("h2", null, "Job graph"),
        h(
          "div",
          { class: "legend" },
          h("span", { class: "legend-item" }, h("i", { class: "dot bp-ok" }), "backpressure ok (≤ 10%)"),
          h("span", { class: "legend-item" }, h("i", { class: "dot bp-low" }), "low (≤ 50%)"),
          h("span", { class: "legend-item" }, h("i", { class: "dot bp-high" }), "high"),
          h("span", { class: "legend-item" }, h("i", { class: "dot bp-none" }), "no measurement"),
        ),
      ),
      h("div", { class: "graph-scroll", style: `max-width: 100%; min-width: ${Math.min(width, 600)}px` }, renderGraph(plan, figures, select)),
    ),
    [...ordered, ...extra].map((v) => vertexSection(v)),
  );
}

function ratioCell(value, testid, levelled = false) {
  const cls = levelled ? `num bp-text-${backpressureLevel(value)}` : "num";
  return h("td", { class: cls, "data-testid": testid }, fmtRatio(value));
}

function vertexSection(vertex) {
  const rows = (vertex.subtasks ?? []).map((t) =>
    h(
      "tr",
      { "data-testid": "subtask-row", "data-subtask": t.subtask },
      num(t.subtask),
      h("td", null, statusBadge(t.status)),
      mono(t.taskmanager_id ?? "—"),
      num(t.attempt),
      num(fmtCount(t["read-records"])),
      num(fmtCount(t["write-records"])),
      ratioCell(t.busyRatio, "subtask-busy"),
      ratioCell(t.backPressuredRatio, "subtask-backpressured", true),
      ratioCell(t.idleRatio, "subtask-idle"),
      num(t.watermark === null || t.watermark === undefined ? "—" : fmtClock(t.watermark)),
      num(t.watermark_lag === null || t.watermark_lag === undefined ? "—" : fmtDuration(t.watermark_lag), {
        "data-testid": "subtask-watermark-lag",
      }),
    ),
  );
  return h(
    "section",
    { class: "panel", "data-testid": "vertex-section", "data-vertex-id": vertex.id },
    h(
      "div",
      { class: "job-title" },
      h("h3", null, vertex.name),
      statusBadge(vertex.status),
      h("span", { class: "muted" }, `parallelism ${vertex.parallelism}`),
      h("span", { class: "mono muted" }, vertex.uid ?? vertex.id),
    ),
    table(
      "subtask-table",
      ["subtask", "status", "TaskManager", "attempt", "records in", "records out", "busy", "backpressured", "idle", "watermark", "watermark lag"],
      rows,
      { "data-vertex-id": vertex.id },
    ),
  );
}

// Checkpoints -----------------------------------------------------------------------------------

function checkpointType(cp) {
  return `${cp.checkpoint_type}${cp.full ? " (full)" : ""}${cp.unaligned ? " (unaligned)" : ""}`;
}

function latestCard(title, cp, testid, extra) {
  if (!cp) return h("div", { class: "latest", "data-testid": testid }, h("h4", null, title), h("p", { class: "muted" }, "none"));
  return h(
    "div",
    { class: "latest", "data-testid": testid },
    h("h4", null, title, " ", h("a", { href: jobLink(cp.jobId, `/checkpoints/${cp.id}`) }, `#${cp.id}`)),
    h(
      "dl",
      { class: "facts compact" },
      fact("triggered", fmtTime(cp.trigger_timestamp)),
      fact("duration", fmtDuration(cp.end_to_end_duration)),
      fact("size", fmtBytes(cp.state_size)),
      extra,
    ),
  );
}

function renderCheckpoints({ job, checkpoints }) {
  const { counts, latest, history } = checkpoints;
  const withJob = (cp) => (cp ? { ...cp, jobId: job.jid } : null);
  const restored = latest.restored;
  const rows = history.map((cp) =>
    h(
      "tr",
      {
        "data-testid": "checkpoint-row",
        "data-checkpoint-id": cp.id,
        "data-status": cp.status,
        class: "clickable",
        onclick: () => (location.hash = jobLink(job.jid, `/checkpoints/${cp.id}`)),
      },
      h("td", null, h("a", { href: jobLink(job.jid, `/checkpoints/${cp.id}`), "data-testid": "checkpoint-link" }, cp.id)),
      h("td", null, statusBadge(cp.status)),
      h("td", null, checkpointType(cp)),
      h("td", { class: "time" }, fmtTime(cp.trigger_timestamp)),
      num(fmtDuration(cp.end_to_end_duration)),
      num(fmtBytes(cp.state_size)),
      num(`${cp.num_acknowledged_subtasks}/${cp.num_subtasks}`),
      h("td", { class: "reason" }, cp.failure_message ?? ""),
    ),
  );
  return h(
    "div",
    null,
    jobHeader(job, "checkpoints"),
    h(
      "section",
      { class: "cards", "data-testid": "checkpoint-counts" },
      card("triggered", counts.total, "count-total"),
      card("completed", counts.completed, "count-completed"),
      card("failed", counts.failed, "count-failed"),
      card("in progress", counts.in_progress, "count-in-progress"),
      card("restored", counts.restored, "count-restored"),
    ),
    h(
      "section",
      { class: "panel latest-row", "data-testid": "checkpoint-latest" },
      latestCard("Latest completed", withJob(latest.completed), "latest-completed", fact("path", h("span", { class: "mono" }, latest.completed?.external_path ?? "—"))),
      latestCard("Latest savepoint", withJob(latest.savepoint), "latest-savepoint", fact("path", h("span", { class: "mono" }, latest.savepoint?.external_path ?? "—"))),
      latestCard("Latest failed", withJob(latest.failed), "latest-failed", fact("reason", latest.failed?.failure_message ?? "—")),
      h(
        "div",
        { class: "latest", "data-testid": "latest-restored" },
        h("h4", null, "Restored from"),
        restored
          ? h(
              "dl",
              { class: "facts compact" },
              fact(restored.is_savepoint ? "savepoint" : "checkpoint", `#${restored.id}`),
              fact("restored at", fmtTime(restored.restore_timestamp)),
            )
          : h("p", { class: "muted" }, "none"),
      ),
    ),
    h(
      "section",
      { class: "panel" },
      h("h2", null, "History"),
      table("checkpoint-history", ["id", "status", "type", "triggered", "duration", "size", "acknowledged", "failure reason"], rows),
    ),
  );
}

function renderCheckpointDetails({ job, details }) {
  const vertexNames = new Map((job.vertices ?? []).map((v) => [v.uid ?? v.id, v.name]));
  const rows = timelineRows(details, job.vertices ?? []);
  // main's padding (2 × 24 px) and the panel's (2 × 18 px + borders)
  const width = Math.max(760, (main().clientWidth || 1200) - 90);
  const { svg, channel, upload } = renderTimeline(rows, vertexNames, width);
  const missing = rows.filter((r) => r.model.source === "durations").length;
  const nameOf = (id) => vertexNames.get(id) ?? id;
  const summary = h(
    "ul",
    { class: "slowest", "data-testid": "timeline-slowest" },
    h(
      "li",
      { "data-testid": "slowest-channel" },
      h("strong", null, "Slowest channel: "),
      channel
        ? `${nameOf(channel.row.subtask.vertex_id)} subtask ${channel.row.subtask.subtask}, channel ${channel.tick.channel} ` +
            `from ${nameOf(channel.tick.upstreamVertex)} subtask ${channel.tick.upstreamSubtask}: its barrier came ` +
            `${fmtDuration(channel.tick.sinceFirst)} after the first one (at +${fmtDuration(channel.tick.at)})`
        : "no channel's barrier came after the first one",
    ),
    h(
      "li",
      { "data-testid": "slowest-upload" },
      h("strong", null, "Slowest upload: "),
      upload ? `${nameOf(upload.row.subtask.vertex_id)} subtask ${upload.row.subtask.subtask}, ${fmtDuration(upload.ms)}` : "none",
    ),
    missing
      ? h("li", null, `${missing} of ${rows.length} subtasks recorded no timeline: drawn from their durations (hatched).`)
      : null,
  );
  const detailRows = rows.map(({ subtask: st }) =>
    h(
      "tr",
      null,
      h("td", null, nameOf(st.vertex_id)),
      num(st.subtask),
      h("td", null, statusBadge(st.status)),
      h("td", null, fmtClock(st.ack_timestamp)),
      num(fmtDuration(st.start_delay)),
      num(fmtDuration(st.alignment_duration)),
      num(fmtDuration(st.sync_duration)),
      num(fmtDuration(st.async_duration)),
      num(fmtBytes(st.state_size)),
      h("td", null, st.unaligned ? "yes" : "no"),
      num(fmtBytes(st.inflight_size)),
      h("td", null, st.timeline ? "recorded" : "from durations"),
    ),
  );
  return h(
    "div",
    null,
    jobHeader(job, "checkpoints"),
    h(
      "section",
      { class: "panel", "data-testid": "checkpoint-details", "data-checkpoint-id": details.id },
      h(
        "div",
        { class: "job-title" },
        h("a", { href: jobLink(job.jid, "/checkpoints"), class: "small" }, "← all checkpoints"),
        h("h2", null, `Checkpoint ${details.id}`),
        statusBadge(details.status),
        h("span", { class: "muted" }, checkpointType(details)),
      ),
      h(
        "dl",
        { class: "facts" },
        fact("triggered", fmtTime(details.trigger_timestamp)),
        fact("last acknowledgement", fmtClock(details.latest_ack_timestamp)),
        fact("end to end", fmtDuration(details.end_to_end_duration)),
        fact("size", fmtBytes(details.state_size)),
        fact("acknowledged", `${details.num_acknowledged_subtasks}/${details.num_subtasks}`),
        fact("path", h("span", { class: "mono" }, details.external_path ?? "—")),
      ),
      details.failure_message ? h("div", { class: "failure" }, h("strong", null, "Failed: "), details.failure_message) : null,
      h("h3", null, "Timeline from the trigger"),
      renderLegend(),
      summary,
      h("div", { class: "timeline-scroll" }, svg),
      h(
        "details",
        { class: "subtask-durations" },
        h("summary", null, "Durations per subtask"),
        table(
          "checkpoint-subtasks",
          ["vertex", "subtask", "status", "acknowledged", "start delay", "alignment", "sync", "async", "state", "unaligned", "in-flight", "timeline"],
          detailRows,
        ),
      ),
    ),
  );
}

// Exceptions ------------------------------------------------------------------------------------

function renderExceptions({ job, exceptions }) {
  const rows = exceptions.entries.map((e) =>
    h(
      "tr",
      { "data-testid": "exception-row" },
      h("td", { class: "time" }, fmtTime(e.timestamp)),
      h("td", { class: "mono" }, e.exceptionName),
      h("td", { class: "message" }, h("pre", null, e.message)),
      h("td", null, h("span", { class: `badge fault-${String(e.fault).toLowerCase()}` }, e.fault)),
      h("td", null, e.retriable ? "yes" : "no"),
      h("td", null, e.taskName ?? "—"),
      num(e.subtask ?? "—"),
      num(e.attempt ?? "—"),
      mono(e.taskmanager_id ?? "—"),
    ),
  );
  return h(
    "div",
    null,
    jobHeader(job, "exceptions"),
    h(
      "section",
      { class: "panel" },
      h("h2", null, "Exception history"),
      exceptions.truncated ? h("p", { class: "muted", "data-testid": "exceptions-truncated" }, "Older entries are not shown.") : null,
      table(
        "exceptions-table",
        ["time", "exception", "message", "fault", "retriable", "task", "subtask", "attempt", "TaskManager"],
        rows,
      ),
    ),
  );
}

// The loop --------------------------------------------------------------------------------------

function showError(error) {
  const banner = document.getElementById("api-error");
  if (!error) {
    banner.hidden = true;
    banner.replaceChildren();
    return;
  }
  const text = error instanceof ApiError ? error.message : `the page failed: ${error?.stack ?? error}`;
  banner.replaceChildren(h("strong", null, "Error: "), text);
  if (error instanceof ApiError && error.status === 401) banner.append(tokenForm());
  banner.hidden = false;
  if (!(error instanceof ApiError)) console.error(error);
}

/** The cluster asks for its bearer token (401): a field to give it, kept for this tab only. */
function tokenForm() {
  const input = h("input", {
    type: "password",
    autocomplete: "off",
    placeholder: "WEIR_AUTH_TOKEN",
    "aria-label": "the cluster's token",
    "data-testid": "token-input",
  });
  const form = h(
    "form",
    { class: "token-form", "data-testid": "token-form" },
    h("span", null, storedToken() ? "That token was refused. Token:" : "This cluster needs its token:"),
    input,
    h("button", { type: "submit", "data-testid": "token-submit" }, "Use token"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    storeToken(input.value.trim());
    state.needsToken = false;
    state.key = null;
    refresh();
  });
  return form;
}

function setIndicator(kind, text) {
  const indicator = document.getElementById("refresh");
  indicator.className = `refresh ${kind}`;
  indicator.dataset.state = kind;
  indicator.querySelector(".refresh-text").textContent = text;
}

async function refresh() {
  clearTimeout(state.timer);
  const gen = state.gen;
  const route = parseRoute(location.hash);
  const view = VIEWS[route.view];
  setIndicator("loading", "loading…");
  try {
    const data = await view.load(route);
    if (gen !== state.gen) return;
    const key = JSON.stringify(data);
    if (key !== state.key) {
      const node = view.render(data, route);
      main().replaceChildren(node);
      state.key = key;
    }
    main().dataset.view = route.view;
    main().dataset.loaded = "true";
    showError(null);
    setIndicator(state.paused ? "paused" : "ok", `${state.paused ? "paused" : "live"} · ${fmtClock(Date.now())}`);
  } catch (error) {
    if (gen !== state.gen) return;
    state.needsToken = error instanceof ApiError && error.status === 401; // polling waits for the token
    showError(error);
    setIndicator("error", `error · ${fmtClock(Date.now())}`);
    if (state.key === null) {
      main().replaceChildren(
        h("section", { class: "panel", "data-testid": "view-error" }, h("h2", null, view.title(route)), h("p", null, String(error.message ?? error))),
      );
      main().dataset.view = route.view;
    }
  } finally {
    if (gen === state.gen && !state.paused && !state.needsToken) state.timer = setTimeout(refresh, POLL_MS);
  }
}

function onRoute() {
  state.gen += 1;
  state.key = null;
  main().dataset.loaded = "false";
  const route = parseRoute(location.hash);
  document.title = `${VIEWS[route.view].title(route)} · Weir · ${location.host}`;
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.dataset.view === (route.view === "taskmanagers" ? "taskmanagers" : "overview"));
  }
  window.scrollTo(0, 0);
  refresh();
}

function installTooltip() {
  const tip = document.getElementById("tooltip");
  document.addEventListener("mousemove", (event) => {
    const target = event.target instanceof Element ? event.target.closest("[data-tip]") : null;
    if (!target) {
      tip.hidden = true;
      return;
    }
    tip.textContent = target.getAttribute("data-tip");
    tip.hidden = false;
    const pad = 14;
    const { innerWidth, innerHeight } = window;
    const rect = tip.getBoundingClientRect();
    const left = Math.min(event.clientX + pad, innerWidth - rect.width - 4);
    const top = event.clientY + pad + rect.height > innerHeight ? event.clientY - rect.height - pad : event.clientY + pad;
    tip.style.left = `${Math.max(4, left)}px`;
    tip.style.top = `${Math.max(4, top)}px`;
  });
}

function start() {
  document.getElementById("cluster").textContent = location.host;
  getJSON("/overview")
    .then((o) => {
      document.getElementById("version").textContent = `v${o["weir-version"]}`;
    })
    .catch(() => {}); // the view's own load shows an unreachable API
  document.getElementById("refresh").addEventListener("click", () => {
    state.paused = !state.paused;
    if (state.paused) {
      clearTimeout(state.timer);
      setIndicator("paused", `paused · ${fmtClock(Date.now())}`);
    } else {
      refresh();
    }
  });
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      state.key = null; // widths are computed at render time: draw again
      refresh();
    }, 200);
  });
  window.addEventListener("hashchange", onRoute);
  installTooltip();
  onRoute();
}

start();
