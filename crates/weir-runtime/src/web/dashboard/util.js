// weir dashboard: DOM helpers and number formatting, shared by the other scripts.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

/** An HTML element with attributes and children (strings become text, never markup). */
function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, as `el`. */
function svgEl(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(node, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

/** A table from header cells and rows of cells; a cell is text or [text, class]. */
function table(target, headers, rows, rowAttrs) {
  const head = el("tr", {}, headers.map((h) => {
    const [text, cls] = Array.isArray(h) ? h : [h, null];
    return el("th", { class: cls }, text);
  }));
  const body = rows.map((r, i) => el("tr", rowAttrs ? rowAttrs(i) : {}, r.map((c) => {
    const [content, cls] = Array.isArray(c) ? c : [c, null];
    return el("td", { class: cls }, content);
  })));
  target.replaceChildren(el("thead", {}, head), el("tbody", {}, body));
}

const isNum = (v) => typeof v === "number" && Number.isFinite(v);

/** 1234 → "1.23k", with an optional unit; "–" for a missing value. */
function fmtCount(v, unit) {
  if (!isNum(v)) return "–";
  const a = Math.abs(v);
  let s;
  if (a >= 1e9) s = (v / 1e9).toFixed(2) + "G";
  else if (a >= 1e6) s = (v / 1e6).toFixed(2) + "M";
  else if (a >= 1e4) s = (v / 1e3).toFixed(1) + "k";
  else if (Number.isInteger(v)) s = String(v);
  else s = v.toFixed(a >= 100 ? 0 : 1);
  return unit ? s + " " + unit : s;
}

/** Bytes in binary units. */
function fmtBytes(v) {
  if (!isNum(v)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
}

/** Milliseconds as "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min". */
function fmtMs(v) {
  if (!isNum(v)) return "–";
  if (v < 1000) return Math.round(v) + " ms";
  if (v < 60000) return (v / 1000).toFixed(1) + " s";
  const s = Math.floor(v / 1000);
  if (s < 3600) return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s";
  const m = Math.floor(s / 60);
  return Math.floor(m / 60) + " h " + String(m % 60).padStart(2, "0") + " min";
}

/** Wall-clock time of a Unix-milliseconds value, local time; with the date if not today. */
function fmtTime(ms) {
  if (!isNum(ms)) return "–";
  const d = new Date(ms);
  const time = d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  if (d.toDateString() === new Date().toDateString()) return time;
  const day = `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`;
  return day + " " + time;
}

/** The largest watermark (end of input) does not survive JSON → double exactly. */
const END_OF_INPUT = 9.2e18;

/** An event-time watermark: ISO time (UTC) for epoch values, the raw number otherwise. */
function fmtWatermark(w) {
  if (!isNum(w)) return "none";
  if (w >= END_OF_INPUT) return "end of input";
  // Event times near the wall clock read best as times; small ones are raw numbers.
  if (w > 946684800000 && w < 4102444800000) return new Date(w).toISOString().slice(11, 23) + "Z";
  return String(w);
}

/** A ratio 0..1 as a percentage. */
const fmtPct = (r) => (isNum(r) ? Math.round(r * 100) + "%" : "–");
