// weir dashboard: the job graph of /v1/operators as an SVG of boxes and arrows.
//
// Layout in layers: an operator's column is the longest path to it from a source; within a
// column, operators are ordered by the mean row of their inputs (fewer crossings). Colours
// follow Flink's convention: busy on a red scale, backpressured grey-blue, idle neutral.
"use strict";

const BOX_W = 214, BOX_H = 106, GAP_X = 74, GAP_Y = 26, PAD = 16;

/**
 * Columns and rows of every operator id. An edge that spans several columns passes through
 * a placeholder in each column it crosses (Sugiyama's dummy nodes: `via[i]` for edge i),
 * which takes a row like a box, so no edge is drawn across a box.
 */
function layout(operators, edges) {
  const col = new Map(operators.map((o) => [o.id, 0]));
  // Longest path: relax until stable (the graph is acyclic; bounded for safety).
  for (let pass = 0; pass <= operators.length; pass++) {
    let changed = false;
    for (const e of edges) {
      const c = (col.get(e.from) ?? 0) + 1;
      if (col.has(e.to) && c > col.get(e.to)) { col.set(e.to, c); changed = true; }
    }
    if (!changed) break;
  }
  const columns = [];
  for (const o of operators) (columns[col.get(o.id)] ||= []).push(o.id);
  const inputs = new Map();
  const via = edges.map((e, i) => {
    const chain = [e.from];
    for (let c = col.get(e.from) + 1; c < col.get(e.to); c++) {
      const id = `via-${i}-${c}`;
      col.set(id, c);
      (columns[c] ||= []).push(id);
      chain.push(id);
    }
    chain.push(e.to);
    for (let k = 1; k < chain.length; k++) {
      if (!inputs.has(chain[k])) inputs.set(chain[k], []);
      inputs.get(chain[k]).push(chain[k - 1]);
    }
    return chain.slice(1, -1);
  });
  const row = new Map();
  columns.forEach((ids, c) => {
    const key = (id) => {
      const ins = (inputs.get(id) || []).filter((x) => row.has(x)).map((x) => row.get(x));
      return c === 0 || ins.length === 0 ? 0 : ins.reduce((a, b) => a + b, 0) / ins.length;
    };
    const keyed = ids.map((id, i) => [key(id), i, id]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    keyed.forEach(([, , id], r) => row.set(id, r));
  });
  const rows = Math.max(1, ...columns.map((c) => (c ? c.length : 0)));
  return { col, row, columns: columns.length, rows, via };
}

/** The box's fill and whether its text must be light, from its busiest subtask. */
function boxColour(op) {
  const running = (op.subtasks || []).some((s) => s.running);
  if (!running) return { fill: "#eceef1", dark: false, state: "not running" };
  const busy = op.busy_ratio || 0, bp = op.backpressured_ratio || 0;
  if (bp >= 0.1 && bp >= busy) {
    const l = 86 - 44 * bp;
    return { fill: `hsl(211, 28%, ${l}%)`, dark: l < 58, state: "backpressured" };
  }
  if (busy < 0.05) return { fill: "#fafafa", dark: false, state: "idle" };
  const l = 96 - 50 * busy;
  return { fill: `hsl(4, ${35 + 50 * busy}%, ${l}%)`, dark: l < 58, state: "busy" };
}

/** The legend of the colours. */
function drawLegend(target) {
  const swatch = (bg, text) => el("span", {}, el("i", { style: `background:${bg}` }), text);
  target.replaceChildren(
    swatch("#fafafa", "idle"),
    swatch("linear-gradient(90deg, hsl(4,52%,86%), hsl(4,85%,46%))", "busy 10 → 100%"),
    swatch("linear-gradient(90deg, hsl(211,28%,82%), hsl(211,28%,42%))", "backpressured 10 → 100%"),
    swatch("#eceef1", "not running"),
    el("span", {}, "dashed: chained into its upstream's task"),
  );
}

function operatorLines(op, names) {
  const lines = [];
  let head = "parallelism " + op.parallelism;
  if (op.chained) head += " · chained to " + (names.get(op.task) || op.task);
  lines.push(head);
  const rate = (v) => (v === null || v === undefined ? "–" : fmtCount(v) + "/s");
  const rin = "in " + rate(op.records_in_per_second), rout = "out " + rate(op.records_out_per_second);
  lines.push(op.kind === "source" ? rout : op.kind === "sink" ? rin : rin + " · " + rout);
  lines.push("busy " + fmtPct(op.busy_ratio) + " · backpressured " + fmtPct(op.backpressured_ratio));
  let wm = "watermark " + fmtWatermark(op.watermark);
  if (isNum(op.watermark_lag_ms)) wm += " · lag " + fmtMs(op.watermark_lag_ms);
  lines.push(wm);
  const parts = Array.isArray(op.partitions) ? op.partitions : [];
  const extra = [];
  if (parts.length) extra.push("Kafka lag " + fmtCount(parts.reduce((a, p) => a + (p.lag || 0), 0)));
  if (isNum(op.state_bytes)) extra.push("state " + fmtBytes(op.state_bytes));
  if (extra.length) lines.push(extra.join(" · "));
  return lines;
}

function tooltip(op) {
  const subs = (op.subtasks || []).map((s) =>
    `#${s.subtask}${s.running ? "" : " (ended)"}: in ${fmtCount(s.records_in)} out ${fmtCount(s.records_out)}, ` +
    `busy ${fmtPct(s.busy_ratio)} idle ${fmtPct(s.idle_ratio)} backpressured ${fmtPct(s.backpressured_ratio)}, ` +
    `watermark ${fmtWatermark(s.watermark)}`);
  return [`${op.name} (${op.kind}, id ${op.id})`, ...subs].join("\n");
}

/** Draws the graph into `svg` (an <svg> element), `selected` (an id) outlined; returns its natural size. */
function drawGraph(svg, view, selected) {
  const ops = view.operators || [], edges = view.edges || [];
  const known = new Set(ops.map((o) => o.id));
  const shown = edges.filter((e) => known.has(e.from) && known.has(e.to));
  const { col, row, columns, rows, via } = layout(ops, shown);
  const width = PAD * 2 + columns * BOX_W + (columns - 1) * GAP_X;
  const height = PAD * 2 + rows * BOX_H + (rows - 1) * GAP_Y;
  const pos = (id) => ({ x: PAD + col.get(id) * (BOX_W + GAP_X), y: PAD + row.get(id) * (BOX_H + GAP_Y) });
  const names = new Map(ops.map((o) => [o.id, o.name]));
  const defs = svgEl("defs", {}, svgEl("marker", {
    id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse",
  }, svgEl("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#7b8594" })));
  const inputs = new Map();
  for (const e of shown) inputs.set(e.to, (inputs.get(e.to) || 0) + 1);
  const edgeEls = shown.map((e, i) => {
    const a = pos(e.from), b = pos(e.to);
    const n = inputs.get(e.to), k = shown.filter((x, j) => x.to === e.to && j < i).length;
    // Out of the source's right side, through each placeholder, into the target's left.
    const pts = [[a.x + BOX_W, a.y + BOX_H / 2]];
    for (const v of via[i]) {
      const p = pos(v);
      pts.push([p.x, p.y + BOX_H / 2], [p.x + BOX_W, p.y + BOX_H / 2]);
    }
    pts.push([b.x, b.y + (BOX_H * (k + 1)) / (n + 1)]);
    let d = `M ${pts[0][0]} ${pts[0][1]}`;
    for (let j = 0; j + 1 < pts.length; j += 2) {
      const [x1, y1] = pts[j], [x2, y2] = pts[j + 1];
      const dx = Math.max(30, (x2 - x1) / 2);
      d += ` C ${x1 + dx} ${y1}, ${x2 - dx} ${y2}, ${x2} ${y2}`;
      if (j + 2 < pts.length) d += ` L ${pts[j + 2][0]} ${pts[j + 2][1]}`;
    }
    const label = e.chained ? "chained" : e.partitioning + (e.port > 0 ? ` (side ${e.port})` : "");
    const [[x1, y1], [x2, y2]] = pts;
    return svgEl("g", { class: "edge" + (e.chained ? " chained" : ""), "data-from": e.from, "data-to": e.to },
      svgEl("path", { d, "marker-end": "url(#arrow)" }),
      svgEl("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, "text-anchor": "middle" }, label));
  });
  const boxes = ops.map((op) => {
    const { x, y } = pos(op.id);
    const c = boxColour(op);
    const text = (cls, dy, s) => svgEl("text", { class: cls + (c.dark ? " on-dark" : ""), x: x + 9, y: y + dy }, s);
    const lines = operatorLines(op, names);
    return svgEl("g", {
      class: "op" + (op.chained ? " chained" : "") + (op.id === selected ? " selected" : ""), id: "op-" + op.id, "data-name": op.name, "data-state": c.state,
    },
    svgEl("title", {}, tooltip(op)),
    svgEl("rect", { class: "box", x, y, width: BOX_W, height: BOX_H, rx: 5, fill: c.fill }),
    text("name", 18, clip(op.name, 28)),
    lines.map((l, i) => text("line", 35 + i * 15, clip(l, 36))));
  });
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren(defs, ...edgeEls, ...boxes);
  return { width, height };
}

const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);
