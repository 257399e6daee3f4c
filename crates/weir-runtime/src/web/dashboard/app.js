// weir dashboard: reads the REST API about once a second and draws every section.
//
// Readiness for tests and scripts: <body data-graph-ready data-checkpoints-ready> once the
// graph and the checkpoint table were drawn from the API, data-api="ok" or "error", and
// data-job-state. Operator boxes are <g class="op" id="op-ID" data-name=NAME>, edges
// <g class="edge">, checkpoint rows <tr class="ckpt" data-id=ID>.
"use strict";

const REFRESH_MS = 1000;
const KEEP_MS = 5 * 60 * 1000;
const $ = (id) => document.getElementById(id);
const state = { throughput: [], lastOk: null, scale: "auto", size: null, selected: null, ops: null };

/** GET a view; errors say which path failed and how. */
async function getJson(path) {
  let res;
  try {
    res = await fetch(path, { cache: "no-store" });
  } catch (e) {
    throw new Error(`${path} did not answer (${e.message}); is the job still running?`);
  }
  const text = await res.text();
  if (!res.ok) {
    let detail = text;
    try { detail = JSON.parse(text).error || text; } catch (_) { /* not JSON: show the text */ }
    throw new Error(`${path} answered HTTP ${res.status} ${res.statusText}: ${String(detail).slice(0, 300)}`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${path} answered something that is not JSON: ${text.slice(0, 120)}`);
  }
}

function showError(message) {
  const banner = $("banner");
  document.body.dataset.api = message ? "error" : "ok";
  if (!message) { banner.hidden = true; banner.textContent = ""; return; }
  const since = state.lastOk
    ? `the figures below are from ${fmtTime(state.lastOk)}`
    : "nothing has been received yet";
  banner.textContent = `Cannot reach the job's API: ${message} — retrying every second; ${since}.`;
  banner.hidden = false;
}

async function refresh() {
  try {
    const [job, ops, cks, exc] = await Promise.all(
      ["/v1/job", "/v1/operators", "/v1/checkpoints", "/v1/exceptions"].map(getJson));
    state.lastOk = Date.now();
    try {
      render(job, ops, cks, exc);
      showError(null);
    } catch (e) {
      showError(`the dashboard could not draw the answer: ${e.message}`);
      console.error(e);
    }
  } catch (e) {
    showError(e.message);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

function render(job, ops, cks, exc) {
  renderJob(job, cks);
  renderGraph(ops);
  renderOperators(ops);
  state.ops = ops;
  renderSubtasks();
  renderThroughput(ops);
  renderCheckpoints(cks);
  renderLag(ops);
  renderExceptions(exc);
  renderCluster(job.cluster);
  $("refreshed").textContent = "updated " + fmtTime(state.lastOk);
}

function renderJob(job, cks) {
  $("job-name").textContent = job.name;
  $("job-state").textContent = job.state;
  $("job-state").className = "state " + job.state;
  document.body.dataset.jobState = job.state;
  document.title = `weir · ${job.name} · ${job.state}`;
  const items = [
    ["uptime", fmtMs(job.uptime_ms)],
    ["attempt", job.attempt],
    ["restarts", job.restarts],
    ["parallelism", job.parallelism],
    ["tasks", job.tasks],
    ["checkpoints", cks.enabled ? `${cks.counts.completed} completed, ${cks.counts.failed} failed` : "off"],
  ];
  if (job.cluster) items.push(["workers", (job.cluster.workers || []).length]);
  if (job.stopped_with_savepoint) items.push(["stopped", "with a savepoint"]);
  if (job.failure) items.push(["failure", job.failure]);
  $("job-overview").replaceChildren(...items.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v))));
}

function renderGraph(ops) {
  const scroll = $("graph-scroll");
  let svg = scroll.querySelector("svg");
  if (!svg) {
    svg = svgEl("svg", { id: "graph", role: "img", "aria-label": "job graph" });
    scroll.replaceChildren(svg);
  }
  state.size = drawGraph(svg, ops, state.selected);
  applyZoom();
  document.body.dataset.graphReady = "true";
}

function applyZoom() {
  const svg = $("graph");
  if (!svg || !state.size) return;
  const fit = Math.max(0.1, ($("graph-scroll").clientWidth - 4) / state.size.width);
  let scale = state.scale;
  if (scale === "auto") scale = Math.min(1, Math.max(0.6, fit));
  else if (scale === "fit") scale = Math.min(1.5, fit);
  svg.style.width = Math.round(state.size.width * scale) + "px";
  svg.style.height = Math.round(state.size.height * scale) + "px";
  svg.dataset.scale = scale.toFixed(3);
}

function zoom(by) {
  const current = Number($("graph")?.dataset.scale || 1);
  state.scale = Math.min(3, Math.max(0.1, current * by));
  applyZoom();
}

function renderOperators(ops) {
  const list = ops.operators || [];
  const has = (k) => list.some((o) => o[k] !== null && o[k] !== undefined);
  const sum = (o, k) => (o.subtasks || []).reduce((a, s) => (isNum(s[k]) ? (a ?? 0) + s[k] : a), null);
  const extra = [["bytes_in", "bytes in"], ["bytes_out", "bytes out"], ["state_bytes", "state"]].filter(([k]) => has(k));
  const headers = ["operator", "kind", ["P", "num"], ["records in", "num"], ["records out", "num"],
    ["in/s", "num"], ["out/s", "num"], "busy", "backpressured", "watermark", ["watermark lag", "num"],
    ["checkpointed state", "num"], ...extra.map(([, h]) => [h, "num"])];
  const ratio = (r, colour) => [el("span", { class: "ratio" },
    el("b", { style: `left:0;width:${Math.round((r || 0) * 100)}%;background:${colour}` })), fmtPct(r)];
  const rows = list.map((o) => [
    o.chained ? "↳ " + o.name : o.name, o.kind, [o.parallelism, "num"],
    [fmtCount(o.records_in), "num"], [fmtCount(o.records_out), "num"],
    [fmtCount(o.records_in_per_second), "num"], [fmtCount(o.records_out_per_second), "num"],
    ratio(o.busy_ratio, "var(--busy)"), ratio(o.backpressured_ratio, "var(--bp)"),
    fmtWatermark(o.watermark), [fmtMs(o.watermark_lag_ms), "num"],
    [fmtBytes(sum(o, "checkpointed_state_bytes")), "num"],
    ...extra.map(([k]) => [fmtBytes(o[k]), "num"]),
  ]);
  table($("operators-table"), headers, rows, (i) => ({
    class: "op-row" + (list[i].id === state.selected ? " selected" : ""), "data-id": list[i].id,
  }));
}

/** Selects the operator whose box or row was clicked, for the subtask table. */
function select(event) {
  const target = event.target.closest("g.op, tr.op-row");
  if (!target) return;
  state.selected = Number(target.id ? target.id.slice(3) : target.dataset.id);
  for (const r of document.querySelectorAll("tr.op-row")) r.classList.toggle("selected", Number(r.dataset.id) === state.selected);
  for (const g of document.querySelectorAll("g.op")) g.classList.toggle("selected", g.id === "op-" + state.selected);
  renderSubtasks();
}

/** Every subtask of the selected operator: where skew and a single slow subtask show. */
function renderSubtasks() {
  const op = state.ops && (state.ops.operators || []).find((o) => o.id === state.selected);
  if (!op) {
    $("subtasks").replaceChildren(el("p", { class: "muted" }, "No operator selected."));
    return;
  }
  $("subtasks-of").textContent = `of ${op.name} (${op.kind}, parallelism ${op.parallelism})`;
  const subs = op.subtasks || [];
  const t = el("table", { id: "subtasks-table" });
  table(t, [["subtask", "num"], "running", ["records in", "num"], ["records out", "num"], ["in/s", "num"],
    ["out/s", "num"], ["busy", "num"], ["idle", "num"], ["backpressured", "num"], "watermark",
    ["checkpointed state", "num"]],
  subs.map((s) => [[s.subtask, "num"], s.running ? "yes" : "ended", [fmtCount(s.records_in), "num"],
    [fmtCount(s.records_out), "num"], [fmtCount(s.records_in_per_second), "num"],
    [fmtCount(s.records_out_per_second), "num"], [fmtPct(s.busy_ratio), "num"], [fmtPct(s.idle_ratio), "num"],
    [fmtPct(s.backpressured_ratio), "num"], fmtWatermark(s.watermark), [fmtBytes(s.checkpointed_state_bytes), "num"]]),
  () => ({ class: "subtask" }));
  $("subtasks").replaceChildren(subs.length ? t : el("p", { class: "muted" }, "No subtask has reported yet."));
}

function renderThroughput(ops) {
  const list = ops.operators || [];
  const total = (kind, key) => list.filter((o) => o.kind === kind)
    .reduce((a, o) => (isNum(o[key]) ? (a ?? 0) + o[key] : a), null);
  const now = Date.now();
  const read = total("source", "records_out_per_second");
  const written = total("sink", "records_in_per_second");
  if (read !== null || written !== null) state.throughput.push({ t: now, read, written });
  state.throughput = state.throughput.filter((p) => now - p.t <= KEEP_MS);
  const pts = (k) => state.throughput.filter((p) => p[k] !== null).map((p) => [p.t, p[k]]);
  lineChart($("throughput-chart"), [
    { name: "read by sources", colour: "#2b6cb0", points: pts("read") },
    { name: "into sinks", colour: "#d9822b", points: pts("written") },
  ], {
    title: "records per second", xLabel: fmtTime, yLabel: (v) => fmtCount(v),
    empty: "No rates yet (records are counted when the job serves its REST API).",
  });
}

function renderCheckpoints(cks) {
  const history = cks.history || [];
  const c = cks.counts || {};
  $("checkpoint-counts").textContent = cks.enabled
    ? `${c.completed} completed · ${c.failed} failed · ${c.in_progress} in progress` +
      (!cks.config ? "" : cks.config.interval_ms > 0
        ? ` · periodic every ${fmtMs(cks.config.interval_ms)}` : " · no periodic checkpoints")
    : "checkpoints are not configured for this job";
  table($("checkpoints-table"),
    [["id", "num"], "kind", "status", "triggered", ["duration", "num"], ["alignment", "num"],
      ["size", "num"], ["acks", "num"], "failure"],
    history.map((k) => [[k.id, "num"], k.unaligned ? `${k.kind} · unaligned` : k.kind, [k.status, "status"], fmtTime(k.trigger_time_ms),
      [fmtMs(k.duration_ms), "num"], [fmtMs(k.alignment_ms), "num"], [fmtBytes(k.size_bytes), "num"],
      [(k.acks || []).length, "num"], [k.failure || "", "wrap"]]),
    (i) => ({ class: "ckpt " + history[i].status, "data-id": history[i].id }));
  if (history.length === 0) {
    $("checkpoints-table").tBodies[0].append(el("tr", {}, el("td", { colspan: 9, class: "muted", id: "checkpoints-empty" },
      cks.enabled ? "No checkpoint triggered yet." : "Run the job with checkpoints configured to see them here.")));
  }
  const done = history.filter((k) => k.status === "COMPLETED" && isNum(k.duration_ms)).reverse();
  lineChart($("checkpoint-duration-chart"), [
    { name: "duration", colour: "#2b6cb0", points: done.map((k) => [k.id, k.duration_ms]) },
    { name: "alignment", colour: "#805ad5", points: done.filter((k) => isNum(k.alignment_ms)).map((k) => [k.id, k.alignment_ms]) },
  ], { title: "duration", xLabel: (x) => "#" + x, yLabel: fmtMs, empty: "No completed checkpoint yet." });
  lineChart($("checkpoint-size-chart"), [
    { name: "size", colour: "#2f855a", points: done.filter((k) => isNum(k.size_bytes)).map((k) => [k.id, k.size_bytes]) },
    // Unaligned checkpoints: the in-flight records stored with them.
    ...(done.some((k) => k.unaligned) ? [{ name: "in flight", colour: "#c05621",
      points: done.filter((k) => k.unaligned).map((k) => [k.id, k.channel_state_bytes]) }] : []),
  ], { title: "size", xLabel: (x) => "#" + x, yLabel: fmtBytes, empty: "No completed checkpoint yet." });
  document.body.dataset.checkpointsReady = "true";
}

function renderLag(ops) {
  const rows = [];
  for (const o of ops.operators || []) {
    for (const p of Array.isArray(o.partitions) ? o.partitions : []) rows.push({ op: o.name, ...p });
  }
  const target = $("lag");
  if (rows.length === 0) {
    target.replaceChildren(el("p", { class: "muted", id: "lag-empty" },
      "No Kafka source in this job reports partitions."));
    return;
  }
  const max = Math.max(1, ...rows.map((r) => r.lag || 0));
  const t = el("table", { id: "lag-table" });
  table(t, ["operator", ["subtask", "num"], "topic", ["partition", "num"], ["position", "num"],
    ["high watermark", "num"], ["lag", "num"], ""],
  rows.map((r) => [r.op, [r.subtask, "num"], r.topic, [r.partition, "num"], [fmtCount(r.position), "num"],
    [fmtCount(r.high_watermark), "num"], [fmtCount(r.lag), "num"],
    el("span", { class: "bar", style: `width:${Math.round(((r.lag || 0) / max) * 120)}px` })]),
  (i) => ({ class: "lag-row", "data-topic": rows[i].topic, "data-partition": rows[i].partition }));
  target.replaceChildren(t);
}

function renderExceptions(exc) {
  const list = exc.exceptions || [];
  const target = $("exceptions");
  if (list.length === 0) {
    target.replaceChildren(el("p", { class: "muted", id: "exceptions-empty" }, "No exceptions."));
    return;
  }
  const t = el("table", { id: "exceptions-table" });
  table(t, ["time", ["attempt", "num"], "where", "root cause"],
    list.map((x) => [fmtTime(x.time_ms), [x.attempt, "num"],
      x.operator === null ? "job" : `${x.operator} #${x.subtask}`,
      [el("details", {}, el("summary", {}, x.root_cause), el("pre", {}, x.message)), "wrap"]]),
    () => ({ class: "exception" }));
  target.replaceChildren(t);
}

function renderCluster(cluster) {
  $("cluster-section").hidden = !cluster;
  if (!cluster) return;
  const t = el("table", {});
  table(t, ["worker", "address", "data address", ["slots", "num"], ["tasks", "num"]],
    (cluster.workers || []).map((w) => [w.id, w.address, w.data_address, [w.slots, "num"], [w.tasks, "num"]]));
  $("cluster").replaceChildren(
    el("p", {}, `coordinator ${cluster.address} · ${cluster.phase} · ${cluster.slots} slots`), t);
}

drawLegend($("legend"));
$("zoom-in").addEventListener("click", () => zoom(1.25));
$("zoom-out").addEventListener("click", () => zoom(0.8));
$("zoom-fit").addEventListener("click", () => { state.scale = "fit"; applyZoom(); });
window.addEventListener("resize", applyZoom);
$("graph-scroll").addEventListener("click", select);
$("operators-table").addEventListener("click", select);
refresh();
