// weir dashboard: line charts drawn by hand as SVG polylines.
"use strict";

/**
 * Draws `series` ([{name, colour, points: [[x, y], ...]}]) into `target`.
 * `opts`: title (for screen readers), xLabel(x) and yLabel(y) to format axis values, empty
 * (the text without data). The chart is as wide as its container, so text keeps its size.
 */
function lineChart(target, series, opts) {
  const W = Math.max(280, Math.floor(target.clientWidth || 560)), H = 180, L = 58, R = 12, T = 26, B = 24;
  const all = series.flatMap((s) => s.points);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": opts.title });
  let lx = L;
  for (const s of series) {
    const last = s.points[s.points.length - 1];
    const label = `${s.name}: ${last ? opts.yLabel(last[1]) : "–"}`;
    svg.append(svgEl("rect", { x: lx, y: 5, width: 10, height: 10, fill: s.colour }));
    svg.append(svgEl("text", { x: lx + 14, y: 14 }, label));
    lx += 14 + label.length * 6.2 + 14;
  }
  if (all.length === 0) {
    svg.append(svgEl("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, opts.empty));
    target.replaceChildren(svg);
    return;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  const yMax = niceMax(Math.max(...all.map((p) => p[1])));
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - y / yMax) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = (yMax * i) / 4;
    svg.append(svgEl("line", { class: i ? "grid" : "axis", x1: L, x2: W - R, y1: sy(y), y2: sy(y) }));
    svg.append(svgEl("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }, opts.yLabel(y)));
  }
  svg.append(svgEl("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  svg.append(svgEl("text", { x: L, y: H - 6 }, opts.xLabel(x0)));
  svg.append(svgEl("text", { x: W - R, y: H - 6, "text-anchor": "end" }, opts.xLabel(x1)));
  for (const s of series) {
    if (s.points.length === 0) continue;
    const pts = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    svg.append(svgEl("polyline", { points: pts, stroke: s.colour, class: "series", "data-series": s.name }));
    if (s.points.length === 1) {
      const [x, y] = s.points[0];
      svg.append(svgEl("circle", { cx: sx(x), cy: sy(y), r: 3, fill: s.colour }));
    }
  }
  target.replaceChildren(svg);
}

/** A round upper bound for an axis (1, 2, 5 × a power of ten). */
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
