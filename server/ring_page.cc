#include "server/ring_page.h"

namespace halka {

const std::string& RingPageHtml() {
  static const std::string* page = new std::string(R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>halka ring</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em} #diag{font-size:1.05em;margin:.6em 0;padding:.5em;background:#fff;border-left:4px solid #888}
#diag.bad{border-color:#d33} #diag.ok{border-color:#3a3}
table{border-collapse:collapse;background:#fff;font-size:.9em} td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:right}
th{background:#f0f0f0} td.l,th.l{text-align:left} .row{display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start}
svg{background:#fff;border:1px solid #ddd} .muted{color:#888} [hidden]{display:none !important}
</style></head><body>
<h1>halka ring <select id="job"></select> <span id="state" class="muted"></span>
<button id="v-ring">ring</button><button id="v-timeline">timeline</button></h1>
<div id="diag">loading…</div>
<div id="timeline-view" hidden><p class="muted">The last operations of every rank, from /api/trace
(the same Chrome trace as <code>halkactl trace</code>): per rank the operation, its phases, the chunk waits
(<span style="color:#e07b00">orange</span>), reduces (<span style="color:#2b6cb0">blue</span>), the links writing
(<span style="color:#2a9d55">green</span>), window stalls (<span style="color:#8e44ad">purple</span>: waiting for the wire to release a segment) and process stalls (black). Refreshes every 5 s.</p>
<svg id="tl" width="1100" height="100"></svg></div>
<div class="row" id="ring-view"><svg id="ring" width="520" height="520" viewBox="0 0 520 520"></svg>
<div><h3>members</h3><table id="members"></table><h3>edges (last minute)</h3><table id="edges"></table></div></div>
<p class="muted">Members sit at their ring positions (each host's ranks adjacent; pos = ring position). Edge colour: throughput relative to the ring's median (red = slow). Refreshes every second from /api/health.</p>
<script>
"use strict";
const $ = id => document.getElementById(id);
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) { const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]); if (text !== undefined) e.textContent = text; return e; }
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;"}[c])); }
function mbps(b) { return (b / 1e6).toFixed(1); }
function colour(ratio) { // 0 = slow (red) .. 1 = at/above median (green)
  const r = Math.max(0, Math.min(1, ratio)); return `hsl(${Math.round(120 * r)},70%,42%)`; }
async function jobs() {
  const list = await (await fetch("api/jobs")).json(); const sel = $("job"); const cur = sel.value;
  sel.innerHTML = list.map(j => `<option>${esc(j)}</option>`).join("");
  const want = new URLSearchParams(location.search).get("job");
  if (want && list.includes(want)) sel.value = want; else if (list.includes(cur)) sel.value = cur;
  return sel.value; }
function draw(h) {
  const svg = $("ring"); svg.innerHTML = "";
  svg.appendChild(el("defs", {})).innerHTML =
    '<marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" markerWidth="22" markerHeight="22" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="context-stroke"/></marker>';
  const g = h.members.length, cx = 260, cy = 260, R = 190;
  // Members sit at their ring positions (each host's ranks adjacent).
  const order = ringOrder(h), at = {}; order.forEach((r, p) => at[r] = p);
  const pos = r => ({x: cx + R * Math.sin(2 * Math.PI * at[r] / g), y: cy - R * Math.cos(2 * Math.PI * at[r] / g)});
  const ring = h.edges.filter(e => e.ring);
  const rates = ring.map(e => e.throughput_bps).sort((a, b) => a - b);
  const median = rates.length ? rates[Math.floor(rates.length / 2)] : 0;
  const d = h.diagnosis || {};
  for (let p = 0; p < g && g > 1; ++p) {
    const r = order[p], to = order[(p + 1) % g], a = pos(r), b = pos(to);
    const e = ring.find(x => x.from === r && x.to === to);
    const slow = d.slowest_from === r && d.slowest_to === to && d.has_straggler;
    const c = !e ? "#bbb" : colour(median > 0 ? e.throughput_bps / median : 1);
    const dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy), ux = dx / len, uy = dy / len, off = 34;
    svg.appendChild(el("line", {x1: a.x + ux * off, y1: a.y + uy * off, x2: b.x - ux * off, y2: b.y - uy * off,
      stroke: c, "stroke-width": slow ? 9 : 5, "marker-end": "url(#arr)", "data-edge": `${r}->${to}`}));
    if (e) svg.appendChild(el("text", {x: (a.x + b.x) / 2 + uy * 34, y: (a.y + b.y) / 2 - ux * 34, "text-anchor": "middle",
      "font-size": 12, fill: c, stroke: "#fff", "stroke-width": 4, "paint-order": "stroke"}, `${mbps(e.throughput_bps)} MB/s`));
  }
  h.members.forEach((m, i) => {
    const p = pos(m.rank), strag = d.has_straggler && d.straggler_rank === m.rank;
    svg.appendChild(el("circle", {cx: p.x, cy: p.y, r: 28, fill: !m.alive ? "#999" : strag ? "#d33" : "#2b6cb0",
      stroke: strag ? "#600" : "#fff", "stroke-width": 3, "data-rank": m.rank}));
    svg.appendChild(el("text", {x: p.x, y: p.y + 5, "text-anchor": "middle", fill: "#fff", "font-size": 15, "font-weight": "bold"}, m.rank));
    svg.appendChild(el("text", {x: p.x, y: p.y + 46, "text-anchor": "middle", "font-size": 11}, m.worker_id + (strag ? " (straggler)" : "")));
    if (m.host) svg.appendChild(el("text", {x: p.x, y: p.y + 59, "text-anchor": "middle", "font-size": 10, fill: "#888", "data-host": m.host}, m.host));
  });
}
// The ranks in ring order (rank order when the reply has none that fits).
function ringOrder(h) {
  const g = h.members.length, o = h.ring_order || [];
  const ok = o.length === g && new Set(o).size === g && o.every(r => r >= 0 && r < g);
  return ok ? o : h.members.map((m, i) => i);
}
function tables(h) {
  const t = h.telemetry || [];
  const at = {}; ringOrder(h).forEach((r, p) => at[r] = p);
  $("members").innerHTML = "<tr><th>rank</th><th>pos</th><th class=l>worker</th><th class=l>host</th><th class=l>address</th><th>alive</th><th>hb age</th><th>ok</th><th>failed</th><th class=l>now</th></tr>" +
    h.members.map((m, i) => { const x = t[i] || {}; const now = x.current_op ? `${x.current_op} ${x.phase} step ${x.step}` + (x.awaited_rank >= 0 ? `, waits for rank ${x.awaited_rank} ${(x.waiting_for_s||0).toFixed(1)} s` : "") : "idle";
      return `<tr><td>${m.rank}</td><td>${at[m.rank]}</td><td class=l>${esc(m.worker_id)}</td><td class=l>${esc(m.host || "")}</td><td class=l>${esc(m.address)}</td><td>${m.alive ? "yes" : "NO"}</td><td>${(m.last_heartbeat_age_s||0).toFixed(1)}s</td><td>${x.ops_completed||0}</td><td>${x.ops_failed||0}</td><td class=l>${esc(now)}</td></tr>`; }).join("");
  $("edges").innerHTML = "<tr><th class=l>edge</th><th>MB</th><th>MB/s</th><th>wait s</th><th>added s</th><th>p50 ms</th><th>p99 ms</th><th>errors</th></tr>" +
    h.edges.filter(e => e.ring || e.bytes > 0).map(e => `<tr><td class=l>${e.ring ? "*" : ""}${e.from}->${e.to}</td><td>${mbps(e.bytes)}</td><td>${mbps(e.throughput_bps)}</td><td>${e.wait_seconds.toFixed(3)}</td><td>${e.added_wait_seconds.toFixed(3)}</td><td>${(e.wait_p50_seconds*1e3).toFixed(2)}</td><td>${(e.wait_p99_seconds*1e3).toFixed(2)}</td><td>${e.errors}</td></tr>`).join("");
}
async function tick() {
  try {
    const job = await jobs();
    if (!job) { $("diag").textContent = "no jobs yet"; return; }
    const h = await (await fetch("api/health?job=" + encodeURIComponent(job))).json();
    if (h.error) { $("diag").textContent = h.error; return; }
    const hosts = (h.hosts || []).length;
    $("state").textContent = (h.failing ? `FAILING (${h.state})` : h.state) +
      `, generation ${h.generation}, ${h.members.length} members` +
      (hosts ? ` on ${hosts} host${hosts === 1 ? "" : "s"}` : "") +
      (h.last_algorithm ? `, last ops: ${h.last_algorithm}, chunk ${h.last_chunk_bytes} B` : "");
    const d = h.diagnosis || {};
    $("diag").textContent = h.failing ? d.failure : (d.summary || "");
    $("diag").className =
      h.failing || d.has_straggler || h.state !== "healthy" ? "bad" : "ok";
    draw(h); tables(h);
    document.body.dataset.ready = "1";
  } catch (e) { $("diag").textContent = "cannot reach the rendezvous: " + e; }
}
const LANES = [["op", "#999"], ["phase", null], ["wait", "#e07b00"], ["reduce", "#2b6cb0"], ["wire", "#2a9d55"], ["window", "#8e44ad"], ["stall", "#000"]];
const PHASE = {"fingerprint": "#b7a4d6", "reduce-scatter": "#f2c14e", "all-gather": "#7fc8a9"};
function drawTimeline(trace) {
  const svg = $("tl"); svg.innerHTML = "";
  const ev = (trace.traceEvents || []).filter(e => e.ph === "X");
  const names = {}; (trace.traceEvents || []).filter(e => e.ph === "M" && e.name === "process_name").forEach(e => names[e.pid] = e.args.name);
  const seqs = [...new Set(ev.filter(e => e.cat === "op").map(e => e.args.op_seq))].sort((a, b) => a - b).slice(-6);
  const shown = ev.filter(e => seqs.includes(e.args.op_seq));
  const pids = Object.keys(names).map(Number).sort((a, b) => a - b);
  if (!shown.length) { svg.setAttribute("height", 30); svg.appendChild(el("text", {x: 10, y: 20}, "no operations yet")); return 0; }
  const t0 = Math.min(...shown.map(e => e.ts)), t1 = Math.max(...shown.map(e => e.ts + e.dur));
  const W = 1100, L = 150, LH = 13, RH = LANES.length * LH + 10, x = t => L + (W - L - 10) * (t - t0) / Math.max(1, t1 - t0);
  svg.setAttribute("height", 30 + RH * pids.length);
  for (let k = 0; k <= 4; ++k) { const t = t0 + (t1 - t0) * k / 4;
    svg.appendChild(el("text", {x: x(t), y: 12, "font-size": 10, "text-anchor": "middle"}, `${((t - t0) / 1e3).toFixed(1)} ms`)); }
  let n = 0;
  pids.forEach((pid, i) => {
    const y0 = 20 + i * RH;
    svg.appendChild(el("text", {x: 4, y: y0 + 14, "font-size": 12, "font-weight": "bold"}, names[pid]));
    LANES.forEach(([cat], j) => svg.appendChild(el("text", {x: L - 6, y: y0 + j * LH + 10, "font-size": 9, fill: "#888", "text-anchor": "end"}, cat)));
    for (const e of shown) {
      if (e.pid !== pid) continue;
      const j = LANES.findIndex(l => l[0] === e.cat); if (j < 0) continue;
      const c = LANES[j][1] || PHASE[e.name] || "#ccc";
      const r = el("rect", {x: x(e.ts), y: y0 + j * LH, width: Math.max(1, x(e.ts + e.dur) - x(e.ts)), height: LH - 2, fill: c, "data-cat": e.cat});
      r.appendChild(el("title", {}, `${e.name}: ${(e.dur / 1e3).toFixed(2)} ms (op #${e.args.op_seq})`));
      svg.appendChild(r); ++n;
      if (e.cat === "op") svg.appendChild(el("text", {x: x(e.ts) + 2, y: y0 + 9, "font-size": 9, fill: "#fff"}, `#${e.args.op_seq}`));
    }
  });
  return n;
}
async function timeline() {
  if ($("timeline-view").hidden) return;
  try {
    const job = $("job").value; if (!job) return;
    const t = await (await fetch("api/trace?job=" + encodeURIComponent(job))).json();
    if (t.error) { $("tl").innerHTML = ""; $("tl").appendChild(el("text", {x: 10, y: 20}, t.error)); return; }
    document.body.dataset.timeline = String(drawTimeline(t));
  } catch (e) { $("tl").innerHTML = ""; }
}
function view(v) {
  $("timeline-view").hidden = v !== "timeline"; $("ring-view").hidden = v === "timeline";
  if (v === "timeline") timeline();
}
$("v-ring").onclick = () => view("ring"); $("v-timeline").onclick = () => view("timeline");
tick().then(() => view(new URLSearchParams(location.search).get("view") || "ring"));
setInterval(tick, 1000); setInterval(timeline, 5000);
</script></body></html>
)HTML");
  return *page;
}

}  // namespace halka
