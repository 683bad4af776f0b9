// dashboard.js — m6's dashboard: polls m6d's JSON (the data of m6ctl
// --json: /api/runs, /api/runs/ID/metrics?after=N, /api/runs/ID/events) and
// draws the runs table and, for the selected run, its curves, phases,
// slot placement and (an MoE run) tokens per expert as plain SVG. No
// libraries. Select a run by clicking its row or with #run=ID in the
// address; ?poll=MS sets the poll period.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const params = new URLSearchParams(location.search);
const POLL_MS = Math.max(100, Number(params.get("poll")) || 1000);

const st = {
  runs: [],
  selected: null,      // run id
  rows: [],            // the selected run's metrics rows, oldest first
  rowsOf: null,        // the run they belong to
  events: [],
  polls: 0,            // completed polls (the test reads it)
  firstStep: null,     // the selected run's last step at its first poll
};
window.m6dash = st;

// ------------------------------------------------------------- formatting

function fmtLoss(v) { return v == null ? "-" : v.toFixed(4); }
function fmtRate(v) { return v == null || v === 0 ? "-" : Math.round(v).toLocaleString("en-US"); }
function fmtEta(s) {
  if (s == null || s < 0) return "-";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
}
function fmtBytes(b) {
  if (b == null || b <= 0) return "-";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toPrecision(4) : b) + " " + u[i];
}
function fmtNum(v) {
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(0) + "k";
  return Number(v.toPrecision(3)).toString();
}

// -------------------------------------------------------------------- svg

function el(tag, attrs, parent, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text != null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function clear(svg) { while (svg.firstChild) svg.removeChild(svg.firstChild); }

// Round tick values over [lo, hi], about n of them.
function ticks(lo, hi, n) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

// A line chart of series [{cls, pts: [[step, y]...], dots}] against step;
// opts.marker: a step to mark (the delink). The x scale is written on the
// svg (data-s0/s1: steps, data-x0/x1: pixels) so a reader can check where
// a step lands.
function lineChart(svg, series, opts) {
  clear(svg);
  const W = 640, H = 260, L = 56, R = 12, T = 10, B = 28;
  const all = series.flatMap(s => s.pts).filter(p => p[1] != null && isFinite(p[1]));
  const s0 = 0;
  let s1 = Math.max(1, opts.maxStep || 0, ...all.map(p => p[0]));
  let y0 = Math.min(...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]));
  if (!all.length) { y0 = 0; y1 = 1; }
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05;
  y0 -= pad; y1 += pad;
  if (opts.zero) y0 = 0;
  const x = s => L + (s - s0) / (s1 - s0) * (W - L - R);
  const y = v => H - B - (v - y0) / (y1 - y0) * (H - T - B);
  Object.assign(svg.dataset, {s0, s1, x0: L, x1: W - R});
  for (const v of ticks(y0, y1, 5)) {
    el("line", {class: "gridline", x1: L, x2: W - R, y1: y(v), y2: y(v)}, svg);
    el("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end"}, svg, fmtNum(v));
  }
  for (const s of ticks(s0, s1, 8)) {
    el("line", {class: "axis", x1: x(s), x2: x(s), y1: H - B, y2: H - B + 4}, svg);
    el("text", {x: x(s), y: H - B + 16, "text-anchor": "middle"}, svg, String(s));
  }
  el("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}, svg);
  el("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}, svg);
  el("text", {x: W - R, y: H - 2, "text-anchor": "end"}, svg, "step");
  if (opts.marker != null) {
    const m = el("line", {id: opts.markerId, class: "delink", x1: x(opts.marker), x2: x(opts.marker),
                          y1: T, y2: H - B, "data-step": opts.marker}, svg);
    el("title", {}, m, "delink at step " + opts.marker);
    el("text", {x: x(opts.marker) + 4, y: T + 12, fill: "#8250df"}, svg, "delink @ " + opts.marker);
  }
  for (const s of series) {
    const pts = s.pts.filter(p => p[1] != null && isFinite(p[1]));
    const d = pts.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(2) + "," + y(p[1]).toFixed(2)).join("");
    el("path", {class: s.cls, d: d || "M0,0", "data-n": pts.length,
                "data-last-step": pts.length ? pts[pts.length - 1][0] : ""}, svg);
    if (s.dots)
      for (const p of pts) el("circle", {class: s.cls + "-pt", cx: x(p[0]), cy: y(p[1]), r: 2.5}, svg);
  }
}

// The phases along the run's steps: pseudo up to the delink, real after,
// what is left to do; the events that name a step as ticks.
function timeline(svg, run, events) {
  clear(svg);
  const W = 1300, L = 10, R = 10, y0 = 8, h = 26;
  const total = Math.max(1, run.total_steps, run.step);
  const x = s => L + s / total * (W - L - R);
  const realFrom = run.phase === "real" ? (run.delink_step != null ? run.delink_step : 0) : null;
  const segs = [];
  if (realFrom == null) segs.push(["pseudo", 0, run.step]);
  else { segs.push(["pseudo", 0, realFrom]); segs.push(["real", realFrom, run.step]); }
  segs.push(["todo", run.step, total]);
  for (const [cls, a, b] of segs)
    if (b > a) {
      const r = el("rect", {class: "seg-" + cls, x: x(a), y: y0, width: x(b) - x(a), height: h,
                            "data-from": a, "data-to": b}, svg);
      el("title", {}, r, cls + ": steps " + a + "–" + b);
    }
  // the delink to come: the spec's pseudo.steps while the run is still pseudo
  const live = ["queued", "running", "paused"].includes(run.state);
  if (realFrom == null && live && run.pseudo_steps > 0 && run.pseudo_steps <= total) {
    const t = el("line", {class: "delink", id: "delink-planned", x1: x(run.pseudo_steps),
                          x2: x(run.pseudo_steps), y1: y0 - 4, y2: y0 + h + 4,
                          "data-step": run.pseudo_steps}, svg);
    // with delink.policy plateau, pseudo.steps is only the latest step
    const plateau = run.delink_policy === "plateau";
    el("title", {}, t, (plateau ? "delink on a plateau, at step " + run.pseudo_steps + " at the latest"
                                : "delink planned at step " + run.pseudo_steps));
    el("text", {x: x(run.pseudo_steps), y: y0 + h + 16, "text-anchor": "middle", fill: "#8250df"},
       svg, plateau ? "latest delink" : "delink planned");
  }
  for (const e of events) {
    const m = /(?:^|\s)step=(\d+)/.exec(e.detail || "");
    if (!m || e.kind === "checkpoint") continue;
    const s = Number(m[1]);
    const t = el("line", {class: "ev", x1: x(s), x2: x(s), y1: y0 - 4, y2: y0 + h + 4}, svg);
    el("title", {}, t, e.kind + " at step " + s);
    const anchor = x(s) > W - 80 ? "end" : x(s) < 80 ? "start" : "middle";
    el("text", {x: x(s), y: y0 + h + 16, "text-anchor": anchor}, svg, e.kind);
  }
  el("text", {x: L, y: 66}, svg, "step 0");
  el("text", {x: W - R, y: 66, "text-anchor": "end"}, svg, String(total));
}

// The slots of the current phase: 0..R-1 resident, the rest offloaded
// (the planner's order, daemon/offload/plan.c).
function slots(svg, run) {
  clear(svg);
  const R = run.resident_slots || 0, O = run.offloaded_slots || 0, S = R + O;
  const W = 1300, w = S ? Math.min(60, (W - 20) / S) : 0;
  for (let s = 0; s < S; s++) {
    const cls = s < R ? "resident" : "offloaded";
    const r = el("rect", {class: "slot-" + cls, x: 10 + s * w, y: 6, width: Math.max(1, w - 3),
                          height: 28, "data-slot": s}, svg);
    el("title", {}, r, "slot " + s + ": " + cls);
    if (w >= 18) el("text", {x: 10 + s * w + (w - 3) / 2, y: 47, "text-anchor": "middle"}, svg, String(s));
  }
  document.getElementById("offload-text").textContent = S
    ? ` ${R}/${S} resident, ${O} offloaded; peak ${fmtBytes(run.peak_device_bytes)}` +
      (run.device_budget_bytes > 0 ? ` of ${fmtBytes(run.device_budget_bytes)} budget` : ", no budget") +
      (run.copy_hidden_fraction != null ? `, ${Math.round(run.copy_hidden_fraction * 100)}% of copy time hidden` : "")
    : " (no sample yet)";
}

// The MoE panel: per-expert token counts of each whole step (the metrics
// rows' moe_step_* and moe_experts_idle, m6ctl metrics' STEP_* and IDLE
// columns); hidden for a dense run, whose rows have none.
function moePanel(run, rows) {
  const m = rows.filter(r => r.moe_step_tokens_max != null);
  const sec = document.getElementById("moe");
  sec.hidden = !m.length;
  if (!m.length) return;
  const opts = id => ({marker: run.delink_step, markerId: id, maxStep: run.total_steps, zero: true});
  lineChart(document.getElementById("moe-tokens-chart"), [
    {cls: "smax", pts: m.map(r => [r.step, r.moe_step_tokens_max])},
    {cls: "smin", pts: m.map(r => [r.step, r.moe_step_tokens_min])},
  ], opts("delink-marker-moe"));
  lineChart(document.getElementById("moe-empty-chart"), [
    {cls: "sempty", pts: m.map(r => [r.step, r.moe_step_experts_empty])},
    {cls: "sidle", pts: m.filter(r => r.moe_experts_idle != null).map(r => [r.step, r.moe_experts_idle])},
  ], opts("delink-marker-moe-empty"));
  const last = m[m.length - 1];
  const t = document.getElementById("moe-text");
  t.dataset.step = last.step;
  t.textContent = `Step ${last.step}: tokens per expert ${last.moe_step_tokens_min}–` +
    `${last.moe_step_tokens_max}, ${last.moe_step_experts_empty} experts without a token, ` +
    `${last.moe_step_dropped} (token, prototype) pairs dropped` +
    (last.moe_experts_idle != null ? `, ${last.moe_experts_idle} idle` : "");
}

// ------------------------------------------------------------------ views

function renderRuns() {
  const tb = document.querySelector("#runs tbody");
  tb.textContent = "";
  for (const r of st.runs) {
    const tr = document.createElement("tr");
    tr.dataset.run = r.id;
    if (r.id === st.selected) tr.className = "selected";
    const cells = [
      [r.id, "num"], [r.name], [r.state + (r.pending ? " (" + r.pending + ")" : ""), "state-" + r.state],
      [r.phase], [r.step + "/" + r.total_steps, "num"], [fmtLoss(r.train_loss), "num"],
      [fmtLoss(r.val_loss), "num"], [fmtRate(r.tokens_per_s), "num"], [fmtEta(r.eta_s), "num"]];
    for (const [v, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = v;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    tr.onclick = () => { location.hash = "run=" + r.id; };
    tb.appendChild(tr);
  }
}

function renderRun() {
  const run = st.runs.find(r => r.id === st.selected);
  const sec = document.getElementById("run");
  sec.hidden = !run;
  if (!run) return;
  document.getElementById("run-title").textContent =
    `Run ${run.id} · ${run.name} · ${run.state} · ${run.phase}` +
    (run.delink_step != null ? ` (delinked at step ${run.delink_step})` : "");
  const rows = st.rows;
  lineChart(document.getElementById("loss-chart"), [
    {cls: "train", pts: rows.map(m => [m.step, m.train_loss])},
    {cls: "val", pts: rows.filter(m => m.val_loss != null).map(m => [m.step, m.val_loss]), dots: true},
  ], {marker: run.delink_step, markerId: "delink-marker", maxStep: run.total_steps});
  lineChart(document.getElementById("tps-chart"), [
    {cls: "tps", pts: rows.map(m => [m.step, m.tokens_per_s])},
  ], {marker: run.delink_step, markerId: "delink-marker-tps", maxStep: run.total_steps, zero: true});
  timeline(document.getElementById("timeline"), run, st.events);
  slots(document.getElementById("slots"), run);
  moePanel(run, rows);
}

// ------------------------------------------------------------------- poll

async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  if (!r.ok) throw new Error(url + ": HTTP " + r.status);
  return r.json();
}

function pickSelected() {
  const m = /run=(\d+)/.exec(location.hash);
  if (m) return Number(m[1]);
  const live = st.runs.find(r => r.state === "running");
  return live ? live.id : st.runs.length ? st.runs[st.runs.length - 1].id : null;
}

async function poll() {
  try {
    st.runs = await getJSON("/api/runs");
    st.selected = pickSelected();
    const run = st.runs.find(r => r.id === st.selected);
    if (run) {
      if (st.rowsOf !== run.id) { st.rows = []; st.rowsOf = run.id; st.firstStep = null; }
      // a restart may have dropped rows past its checkpoint: read again
      if (st.rows.length && st.rows[st.rows.length - 1].step > run.step) st.rows = [];
      for (;;) {
        const after = st.rows.length ? st.rows[st.rows.length - 1].step : 0;
        const page = await getJSON(`/api/runs/${run.id}/metrics?after=${after}`);
        st.rows.push(...page);
        if (page.length < 10000) break;
      }
      st.events = await getJSON(`/api/runs/${run.id}/events`);
      if (st.firstStep == null) st.firstStep = run.step;
    }
    renderRuns();
    renderRun();
    st.polls++;
    document.getElementById("daemon").textContent =
      `${st.runs.length} run${st.runs.length === 1 ? "" : "s"} · updated ${new Date().toLocaleTimeString("en-GB")}`;
  } catch (e) {
    document.getElementById("daemon").textContent = "m6d unreachable: " + e.message;
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("hashchange", () => { st.selected = pickSelected(); renderRuns(); renderRun(); });
poll();
