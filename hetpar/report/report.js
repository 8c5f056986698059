// hetpar HTML report: draws the summary, breakdown, memory, timeline, plans and curves
// from the JSON bundle embedded in the page. No external dependencies, works offline.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const COLORS = {
  F: "#4c78a8", B: "#f58518", W: "#54a24b", forward: "#4c78a8", backward: "#f58518",
  weight: "#54a24b", comm: "#e45756",
  params: "#4c78a8", grads: "#f58518", optimizer_state: "#eeca3b", activations: "#54a24b",
  other: "#bab0ac",
};
// the breakdown keys' colours arrive with the data (breakdown_keys: the simulator's registry)
const PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b",
  "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"];

function el(tag, attrs, parent) {
  const ns = ["svg", "rect", "line", "text", "g", "path", "title", "polyline", "circle"];
  const e = ns.includes(tag) ? document.createElementNS(SVGNS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  if (parent) parent.appendChild(e);
  return e;
}

function color(name, i) { return COLORS[name] || PALETTE[i % PALETTE.length]; }

function fmt(x, digits) {
  if (typeof x !== "number") return String(x);
  if (x !== 0 && (Math.abs(x) >= 1e5 || Math.abs(x) < 1e-3)) return x.toExponential(2);
  return x.toFixed(digits === undefined ? 3 : digits);
}

function drawSummary(root, r) {
  const items = [
    ["Iteration time", fmt(r.iteration_time_s) + " s"],
    ["Tokens/s", fmt(r.tokens_per_s, 0)],
    ["Tokens/s per GPU", fmt(r.tokens_per_s_per_gpu, 1)],
    ["MFU", fmt(100 * (r.mfu || 0), 1) + " %"],
    ["HFU", fmt(100 * (r.hfu || 0), 1) + " %"],
    ["GPUs", String(r.num_gpus)],
    ["Bound by", String(r.bottleneck)],
    ["Memory", r.oom ? "OUT OF MEMORY" : "fits"],
  ];
  for (const [k, v] of items) {
    const card = el("div", { class: "card" + (k === "Memory" && r.oom ? " bad" : "") }, root);
    el("div", { class: "k", text: k }, card);
    el("div", { class: "v", text: v }, card);
  }
}

function drawBreakdown(root, breakdown, keys) {
  // in the registry's order; a key it does not list (an older bundle) after them
  const order = (keys || []).map((t) => t.key);
  const listed = order.filter((k) => k in (breakdown || {})).map((k) => [k, breakdown[k]]);
  const rest = Object.entries(breakdown || {}).filter(([k]) => !order.includes(k));
  const entries = listed.concat(rest).filter(([, v]) => v > 0);
  const total = entries.reduce((s, [, v]) => s + v, 0) || 1;
  const W = 900, H = 40;
  const svg = el("svg", { width: W, height: H + 60, viewBox: `0 0 ${W} ${H + 60}` }, root);
  let x = 0;
  entries.forEach(([k, v], i) => {
    const w = (v / total) * W;
    const r = el("rect", { x, y: 0, width: Math.max(w, 0.5), height: H, fill: color(k, i),
      class: "seg" }, svg);
    el("title", { text: `${k}: ${fmt(v)} s (${fmt(100 * v / total, 1)} %)` }, r);
    x += w;
  });
  let lx = 0;
  entries.forEach(([k, v], i) => {
    el("rect", { x: lx, y: H + 12, width: 10, height: 10, fill: color(k, i) }, svg);
    el("text", { x: lx + 14, y: H + 21, "font-size": 11,
      text: `${k} ${fmt(100 * v / total, 1)}%` }, svg);
    lx += 14 + 8 * (k.length + 7);
    if (lx > W - 100) lx = 0;
  });
}

function memGiB(m, key) {
  for (const k of [key + "_gib", key]) {
    if (typeof m[k] === "number") return m[k] > 1e6 ? m[k] / 2 ** 30 : m[k];
  }
  return 0;
}

function drawMemory(root, memory) {
  const parts = ["params", "grads", "optimizer", "activations", "other"];
  const rows = memory || [];
  const W = 900, rowH = 22, left = 170;
  const cap = Math.max(...rows.map((m) => Math.max(memGiB(m, "capacity"), memGiB(m, "total"))), 1);
  const svg = el("svg", { width: W, height: rows.length * rowH + 40,
    viewBox: `0 0 ${W} ${rows.length * rowH + 40}` }, root);
  rows.forEach((m, i) => {
    const y = i * rowH;
    const label = `replica ${m.replica ?? "?"} stage ${m.stage ?? m.rank ?? i}` +
      (m.gpu ? ` (${m.gpu})` : "");
    el("text", { x: 0, y: y + 15, "font-size": 11, text: label }, svg);
    let x = left;
    parts.forEach((p, j) => {
      const v = memGiB(m, p);
      const w = (v / cap) * (W - left - 10);
      const r = el("rect", { x, y: y + 3, width: Math.max(w, 0), height: rowH - 6,
        fill: color(p === "optimizer" ? "optimizer_state" : p, j), class: "mem" }, svg);
      el("title", { text: `${p}: ${fmt(v, 2)} GiB` }, r);
      x += w;
    });
    const c = memGiB(m, "capacity");
    if (c > 0) {
      const cx = left + (c / cap) * (W - left - 10);
      el("line", { x1: cx, x2: cx, y1: y, y2: y + rowH, stroke: m.oom ? "#d00" : "#000",
        "stroke-width": 2, class: "capacity" }, svg);
    }
  });
  const ly = rows.length * rowH + 20;
  parts.forEach((p, j) => {
    el("rect", { x: left + j * 120, y: ly, width: 10, height: 10,
      fill: color(p === "optimizer" ? "optimizer_state" : p, j) }, svg);
    el("text", { x: left + j * 120 + 14, y: ly + 9, "font-size": 11, text: p }, svg);
  });
  el("text", { x: 0, y: ly + 9, "font-size": 11, text: "| = capacity" }, svg);
}

function timelineTracks(trace) {
  const events = (trace && (trace.traceEvents || trace)) || [];
  const names = {};
  const tracks = new Map();
  for (const e of events) {
    if (e.ph === "M" && e.name === "thread_name") names[`${e.pid}/${e.tid}`] = e.args.name;
    if (e.ph === "M" && e.name === "process_name" && e.tid === undefined) {
      names[`${e.pid}`] = e.args.name;
    }
  }
  for (const e of events) {
    if (e.ph !== "X") continue;
    const key = `${e.pid}/${e.tid}`;
    if (!tracks.has(key)) {
      tracks.set(key, { name: names[key] || names[`${e.pid}`] || key, events: [] });
    }
    tracks.get(key).events.push(e);
  }
  return [...tracks.values()];
}

function drawTimeline(root, trace) {
  const tracks = timelineTracks(trace);
  if (!tracks.length) { el("p", { text: "No timeline in this report." }, root); return; }
  const W = 900, left = 190, rowH = 18;
  let t0 = Infinity, t1 = -Infinity;
  for (const t of tracks) for (const e of t.events) {
    t0 = Math.min(t0, e.ts); t1 = Math.max(t1, e.ts + (e.dur || 0));
  }
  const view = { a: t0, b: t1 };
  const H = tracks.length * rowH + 24;
  const bar = el("div", { class: "tlbar" }, root);
  const reset = el("button", { id: "tl-reset", text: "Reset zoom" }, bar);
  el("span", { class: "hint", text: " wheel: zoom, drag: pan" }, bar);
  const svg = el("svg", { id: "timeline-svg", width: W, height: H, viewBox: `0 0 ${W} ${H}` },
    root);
  function render() {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const scale = (W - left) / (view.b - view.a);
    tracks.forEach((t, i) => {
      const y = i * rowH;
      el("text", { x: 0, y: y + 13, "font-size": 10, text: t.name.slice(0, 32) }, svg);
      for (const e of t.events) {
        const xa = left + (e.ts - view.a) * scale;
        const xb = left + (e.ts + (e.dur || 0) - view.a) * scale;
        if (xb < left || xa > W) continue;
        const x = Math.max(xa, left);
        const r = el("rect", { x, y: y + 2, width: Math.max(Math.min(xb, W) - x, 0.5),
          height: rowH - 4, fill: color(e.cat || (e.name || "")[0], 0), class: "ev" }, svg);
        el("title", { text: `${e.name} [${e.cat || ""}] ${fmt(e.dur / 1e3)} ms` }, r);
      }
    });
    const ay = tracks.length * rowH + 14;
    for (let k = 0; k <= 4; k++) {
      const t = view.a + (k / 4) * (view.b - view.a);
      el("text", { x: left + (k / 4) * (W - left - 40), y: ay, "font-size": 10,
        text: `${fmt((t - t0) / 1e3, 1)} ms` }, svg);
    }
  }
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const rect = svg.getBoundingClientRect();
    const fx = Math.min(Math.max((ev.clientX - rect.left - left) / (W - left), 0), 1);
    const c = view.a + fx * (view.b - view.a);
    const k = ev.deltaY < 0 ? 0.8 : 1.25;
    view.a = c - (c - view.a) * k; view.b = c + (view.b - c) * k;
    render();
  });
  let drag = null;
  svg.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, a: view.a, b: view.b }; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const dt = ((ev.clientX - drag.x) / (W - left)) * (drag.b - drag.a);
    view.a = drag.a - dt; view.b = drag.b - dt; render();
  });
  reset.addEventListener("click", () => { view.a = t0; view.b = t1; render(); });
  render();
}

function drawPlans(root, plans) {
  const table = el("table", { id: "plans-table" }, root);
  const head = el("tr", {}, table);
  const cols = ["#", "plan", "tokens/s/GPU", "MFU %", "iteration s", "peak GiB", "OOM", "bound by"];
  for (const c of cols) el("th", { text: c }, head);
  plans.forEach((p, i) => {
    const r = p.report || {};
    const peak = Math.max(0, ...(r.memory || []).map((m) => memGiB(m, "total")));
    const tr = el("tr", { class: "plan-row" }, table);
    const vals = [i + 1, p.name || p.summary || "", fmt(r.tokens_per_s_per_gpu, 1),
      fmt(100 * (r.mfu || 0), 1), fmt(r.iteration_time_s), fmt(peak, 1), r.oom ? "yes" : "no",
      r.bottleneck || ""];
    for (const v of vals) el("td", { text: String(v) }, tr);
  });
}

function drawCurve(root, c) {
  const W = 900, H = 260, L = 60, B = 30;
  const box = el("div", { class: "curve" }, root);
  el("h3", { text: c.title || "" }, box);
  const svg = el("svg", { width: W, height: H + B, viewBox: `0 0 ${W} ${H + B}` }, box);
  const xs = c.series.flatMap((s) => s.x), ys = c.series.flatMap((s) => s.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys) || 1;
  const X = (x) => L + ((x - x0) / ((x1 - x0) || 1)) * (W - L - 130);
  const Y = (y) => H - ((y - y0) / ((y1 - y0) || 1)) * (H - 10);
  el("line", { x1: L, x2: W - 130, y1: H, y2: H, stroke: "#555" }, svg);
  el("line", { x1: L, x2: L, y1: 0, y2: H, stroke: "#555" }, svg);
  el("text", { x: L, y: H + 20, "font-size": 11, text: `${c.x_label || ""}: ${fmt(x0, 2)} .. ${fmt(x1, 2)}` }, svg);
  el("text", { x: 0, y: 12, "font-size": 11, text: `${fmt(y1, 2)}` }, svg);
  el("text", { x: 0, y: H, "font-size": 11, text: `${fmt(y0, 2)}` }, svg);
  c.series.forEach((s, i) => {
    const pts = s.x.map((x, j) => `${X(x)},${Y(s.y[j])}`).join(" ");
    el("polyline", { points: pts, fill: "none", stroke: color("", i), "stroke-width": 2,
      class: "series" }, svg);
    el("text", { x: W - 120, y: 14 + 14 * i, "font-size": 11, fill: color("", i),
      text: s.name }, svg);
  });
  if (c.y_label) el("text", { x: L + 4, y: 12, "font-size": 11, text: c.y_label }, svg);
}

function main() {
  const data = JSON.parse(document.getElementById("hetpar-data").textContent);
  for (const t of data.breakdown_keys || []) if (t.color) COLORS[t.key] = t.color;
  document.getElementById("title").textContent = data.title || "hetpar report";
  const plans = data.plans || [];
  const best = (plans[0] && plans[0].report) || {};
  drawSummary(document.getElementById("summary"), best);
  drawBreakdown(document.getElementById("breakdown"), best.breakdown, data.breakdown_keys);
  drawMemory(document.getElementById("memory"), best.memory);
  drawTimeline(document.getElementById("timeline"), data.trace);
  drawPlans(document.getElementById("plans"), plans);
  const curves = document.getElementById("curves");
  if (!(data.curves || []).length) el("p", { text: "No curves in this report." }, curves);
  for (const c of data.curves || []) drawCurve(curves, c);
  document.body.setAttribute("data-ready", "1");
}

main();
