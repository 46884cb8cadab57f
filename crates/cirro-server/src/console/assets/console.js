// The Cirro console: polls the node's JSON API and draws what it gets.
// Data goes into the page as text only (textContent), never as markup.
"use strict";

const state = { since: 0, samples: [], nodes: {}, slowMs: 0, selected: null };

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function ms(n) {
  if (n < 1000) return n + " ms";
  if (n < 60000) return (n / 1000).toFixed(1) + " s";
  return Math.floor(n / 60000) + " min " + Math.round((n % 60000) / 1000) + " s";
}

function bar(share, label) {
  const td = el("td");
  const outer = el("span", null, share === null ? "bar indeterminate" : "bar");
  const inner = el("span");
  if (share !== null) inner.style.width = Math.round(Math.max(0, Math.min(1, share)) * 100) + "%";
  outer.appendChild(inner);
  td.appendChild(outer);
  td.appendChild(el("span", label));
  return td;
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  if (response.status === 401) { window.location = "/login"; throw new Error("logged out"); }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error + " (SQLSTATE " + body.sqlstate + ")");
  return body;
}

function fill(table, rows) {
  const body = document.querySelector("#" + table + " tbody");
  body.replaceChildren(...rows);
}

function nodeName(number) {
  const node = state.nodes[number];
  return node ? node.id : String(number);
}

async function refreshStatus() {
  const status = await api("/api/status");
  document.getElementById("node").textContent = "node " + status.node + " · Cirro " + status.version;
  document.getElementById("user").textContent = status.user + (status.superuser ? " (superuser)" : "");
  state.slowMs = status.slow_query_ms;
  document.getElementById("slow-ms").textContent = status.slow_query_ms;
}

async function refreshNodes() {
  const nodes = await api("/api/nodes");
  state.nodes = {};
  fill("nodes", nodes.map(n => {
    state.nodes[n.number] = n;
    const tr = el("tr");
    tr.dataset.node = n.id;
    tr.appendChild(el("td", n.id + (n.this ? " (this node)" : "")));
    tr.appendChild(el("td", n.state));
    tr.appendChild(bar(n.cpu_percent / 100, n.cpu_percent.toFixed(1) + " % of " + n.cores + " cores"));
    tr.appendChild(bar(n.memory_bytes ? n.memory_used / n.memory_bytes : 0, bytes(n.memory_used) + " of " + bytes(n.memory_bytes)));
    tr.appendChild(bar(n.disk_bytes ? 1 - n.disk_free / n.disk_bytes : 0, bytes(n.disk_free) + " free"));
    tr.appendChild(el("td", bytes(n.cache_bytes)));
    tr.appendChild(el("td", n.queries));
    tr.appendChild(el("td", n.pg || n.http || ""));
    return tr;
  }));
}

async function cancel(id, button) {
  button.disabled = true;
  const notice = document.getElementById("action");
  try {
    await api("/api/queries/" + id + "/cancel", { method: "POST", headers: { "x-cirro-console": "1" } });
    notice.textContent = "Cancelled statement " + id + ".";
    notice.className = "notice";
  } catch (e) {
    notice.textContent = "Statement " + id + ": " + e.message;
    notice.className = "error";
    button.disabled = false;
  }
  refreshQueries();
}

async function showDetail(id) {
  state.selected = id;
  const q = await api("/api/queries/" + id);
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-id").textContent = q.id + " (" + q.state + ", " + ms(q.elapsed_ms) + ")";
  document.getElementById("detail-query").textContent = q.query;
  document.getElementById("detail-error").textContent = q.error || "";
  document.getElementById("detail-plan").textContent = q.plan || "(no plan: the statement planned no query)";
}

async function refreshQueries() {
  const queries = await api("/api/queries");
  const live = queries.filter(q => q.state === "queued" || q.state === "running");
  fill("live", live.map(q => {
    const tr = el("tr");
    tr.dataset.id = q.id;
    tr.dataset.state = q.state;
    tr.appendChild(el("td", q.id));
    tr.appendChild(el("td", nodeName(q.node)));
    tr.appendChild(el("td", q.user));
    tr.appendChild(el("td", q.state, "state"));
    tr.appendChild(bar(q.progress, q.progress === null ? "" : Math.round(q.progress * 100) + " %"));
    tr.appendChild(el("td", ms(q.elapsed_ms)));
    tr.appendChild(el("td", bytes(q.memory)));
    tr.appendChild(el("td", bytes(q.spilled_bytes)));
    tr.appendChild(el("td", q.rows));
    tr.appendChild(el("td", q.query, "sql"));
    const td = el("td");
    const button = el("button", "Cancel", "cancel");
    button.dataset.id = q.id;
    button.addEventListener("click", () => cancel(q.id, button));
    td.appendChild(button);
    tr.appendChild(td);
    return tr;
  }));
  const slowOnly = document.getElementById("slow-only").checked;
  const ended = queries
    .filter(q => q.state !== "queued" && q.state !== "running")
    .filter(q => !slowOnly || q.elapsed_ms >= state.slowMs)
    .sort((a, b) => b.ended_ms - a.ended_ms)
    .slice(0, 200);
  fill("finished", ended.map(q => {
    const tr = el("tr", null, "clickable");
    tr.dataset.id = q.id;
    tr.dataset.state = q.state;
    tr.appendChild(el("td", q.id));
    tr.appendChild(el("td", nodeName(q.node)));
    tr.appendChild(el("td", q.user));
    tr.appendChild(el("td", q.state + (q.error ? ": " + q.error : ""), "state"));
    tr.appendChild(el("td", ms(q.elapsed_ms)));
    tr.appendChild(el("td", bytes(q.peak_memory)));
    tr.appendChild(el("td", bytes(q.spilled_bytes)));
    tr.appendChild(el("td", q.rows));
    tr.appendChild(el("td", q.query, "sql"));
    tr.addEventListener("click", () => showDetail(q.id));
    return tr;
  }));
}

async function refreshTables() {
  const tables = await api("/api/tables");
  fill("tables", tables.map(t => {
    const tr = el("tr");
    tr.dataset.table = t.schema + "." + t.table;
    tr.appendChild(el("td", t.database + "." + t.schema + "." + t.table));
    tr.appendChild(el("td", t.version));
    tr.appendChild(el("td", t.files));
    tr.appendChild(el("td", bytes(t.bytes)));
    tr.appendChild(el("td", t.rows));
    tr.appendChild(el("td", t.compression_ratio === null ? "" : t.compression_ratio.toFixed(2) + "×"));
    tr.appendChild(el("td", t.files_with_deletion_vectors));
    tr.appendChild(el("td", t.deleted_rows));
    return tr;
  }));
}

function plot(svgId, series, maxOf) {
  const svg = document.getElementById(svgId);
  const samples = state.samples;
  if (samples.length < 2) return;
  const t0 = samples[0].t, t1 = samples[samples.length - 1].t;
  const max = Math.max(1, ...samples.map(maxOf));
  const lines = series.map(([cls, f]) => {
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("class", cls);
    line.setAttribute("points", samples.map(s =>
      ((s.t - t0) / Math.max(1, t1 - t0) * 600).toFixed(1) + "," + (158 - f(s) / max * 150).toFixed(1)).join(" "));
    return line;
  });
  const label = document.createElementNS("http://www.w3.org/2000/svg", "text");
  label.setAttribute("x", "4");
  label.setAttribute("y", "12");
  label.setAttribute("font-size", "11");
  label.textContent = "max " + (svgId === "plot-memory" ? (max / 1048576).toFixed(0) + " MB" : max);
  svg.replaceChildren(...lines, label);
}

async function refreshHistory() {
  const history = await api("/api/history?since=" + state.since);
  state.samples = state.samples.concat(history.samples).slice(-900);
  if (state.samples.length) state.since = state.samples[state.samples.length - 1].t;
  plot("plot-memory", [["memory", s => s.memory_used]], s => Math.max(s.memory_used, 1 << 20));
  plot("plot-queries", [["running", s => s.running], ["queued", s => s.queued]], s => Math.max(s.running, s.queued));
}

async function tick(n) {
  try {
    if (n === 0) await refreshStatus();
    await refreshNodes();
    await refreshQueries();
    await refreshHistory();
    if (n % 10 === 0) await refreshTables();
    document.body.dataset.ready = "1";
  } catch (e) {
    document.getElementById("action").textContent = e.message;
  }
  setTimeout(() => tick(n + 1), 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("slow-only").addEventListener("change", refreshQueries);
  tick(0);
});
