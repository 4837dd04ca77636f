// The dashboard of `weir serve`: the queries a token may see, their status and last error,
// and per query charts of the progress records (Spark UI's Structured Streaming tab), kept
// live by polling the API with the token. No framework and no build step: the server embeds
// this file as it is.
"use strict";

const POLL_MS = 1000;
const KEEP = 300; // points per chart
const state = { token: sessionStorage.getItem("weir-token") || "", queries: new Map(), timer: null };

const $ = (sel, root = document) => root.querySelector(sel);

async function api(method, path) {
  const res = await fetch(path, { method, headers: { Authorization: `Bearer ${state.token}` } });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(body.error || `${res.status}`), { status: res.status });
  return body;
}

// One query's panel and the points of its charts.
function panel(name) {
  let q = state.queries.get(name);
  if (q) return q;
  const node = $("#query-template").content.firstElementChild.cloneNode(true);
  node.dataset.query = name;
  $(".name", node).textContent = name;
  $(".stop", node).addEventListener("click", () => act(name, "stop"));
  $(".start", node).addEventListener("click", () => act(name, "start"));
  $("#queries").append(node);
  q = { node, after: null, points: [] };
  state.queries.set(name, q);
  return q;
}

async function act(name, action) {
  const q = panel(name);
  $(".stop", q.node).disabled = $(".start", q.node).disabled = true;
  try {
    show(q, await api("POST", `/v1/queries/${encodeURIComponent(name)}/${action}`));
  } catch (e) {
    $(".error", q.node).textContent = `${action}: ${e.message}`;
  }
}

function show(q, info) {
  const status = $(".status", q.node);
  status.textContent = info.status;
  status.className = `status ${info.status}`;
  q.node.dataset.status = info.status;
  $(".error", q.node).textContent = info.error || "";
  const p = info.progress;
  $(".batch", q.node).textContent = p ? `batch ${p.batchId} · ${p.timestamp}` : "no batch yet";
  $(".stop", q.node).disabled = !(info.status === "running");
  $(".start", q.node).disabled = info.status === "running" || info.status === "stopping";
}

// The figures one progress record gives each chart.
function point(p) {
  const stateRows = (p.stateOperators || []).reduce((n, op) => n + (op.numRowsTotal || 0), 0);
  const wm = p.eventTime && p.eventTime.watermark ? Date.parse(p.eventTime.watermark) : NaN;
  const lag = Number.isFinite(wm) && wm > 0 ? Math.max(0, (Date.parse(p.timestamp) - wm) / 1000) : null;
  return {
    batch: p.batchId,
    input: p.inputRowsPerSecond || 0,
    processed: p.processedRowsPerSecond || 0,
    duration: (p.durationMs && p.durationMs.triggerExecution) || p.batchDuration || 0,
    state: stateRows,
    lag,
  };
}

const CHARTS = {
  rate: [["input", "#1f6feb"], ["processed", "#e36209"]],
  duration: [["duration", "#1f6feb"]],
  state: [["state", "#1f6feb"]],
  lag: [["lag", "#1f6feb"]],
};

function draw(canvas, points, series) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, h);
  const values = points.flatMap((p) => series.map(([k]) => p[k]).filter((v) => v !== null));
  canvas.dataset.points = String(values.length ? points.length : 0);
  ctx.fillStyle = "#66727f";
  ctx.font = "10px system-ui, sans-serif";
  if (!values.length) {
    ctx.fillText("no data yet", pad, h / 2);
    return;
  }
  const max = Math.max(...values, 1e-9);
  ctx.fillText(max >= 1000 ? max.toExponential(1) : String(+max.toFixed(2)), 2, 10);
  ctx.fillText("0", 2, h - 4);
  ctx.strokeStyle = "#d9dee3";
  ctx.beginPath();
  ctx.moveTo(pad, h - pad / 2);
  ctx.lineTo(w - 4, h - pad / 2);
  ctx.stroke();
  const x = (i) => pad + (points.length === 1 ? 0 : (i * (w - pad - 8)) / (points.length - 1));
  const y = (v) => h - pad / 2 - (v / max) * (h - pad);
  series.forEach(([key, color], i) => {
    if (series.length > 1) {
      ctx.fillStyle = color;
      ctx.fillText(key, w - 70, 12 + 12 * i);
    }
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let started = false;
    points.forEach((p, i) => {
      if (p[key] === null) return;
      if (started) ctx.lineTo(x(i), y(p[key]));
      else ctx.moveTo(x(i), y(p[key]));
      started = true;
    });
    if (points.length === 1) ctx.arc(x(0), y(points[0][key] || 0), 2, 0, 2 * Math.PI);
    ctx.stroke();
  });
}

async function refresh() {
  let list;
  try {
    list = await api("GET", "/v1/queries");
  } catch (e) {
    if (e.status === 401 || e.status === 403) return signOut(e.message);
    return;
  }
  $("#empty").hidden = list.length > 0;
  const names = new Set(list.map((q) => q.name));
  for (const [name, q] of state.queries) {
    if (!names.has(name)) {
      q.node.remove();
      state.queries.delete(name);
    }
  }
  for (const info of list) {
    const q = panel(info.name);
    show(q, info);
    const after = q.after === null ? "" : `?after=${q.after}`;
    try {
      const records = await api("GET", `/v1/queries/${encodeURIComponent(info.name)}/progress${after}`);
      for (const p of records) {
        q.points.push(point(p));
        q.after = p.batchId;
      }
      q.points.splice(0, Math.max(0, q.points.length - KEEP));
    } catch (e) {
      $(".error", q.node).textContent = e.message;
    }
    for (const canvas of q.node.querySelectorAll("canvas")) {
      draw(canvas, q.points, CHARTS[canvas.dataset.chart]);
    }
  }
}

function signIn(token) {
  state.token = token;
  sessionStorage.setItem("weir-token", token);
  $("#login-form").hidden = true;
  $("#logout").hidden = false;
  api("GET", "/v1/tenant")
    .then((t) => ($("#who").textContent = `tenant ${t.name}`))
    .catch((e) => signOut(e.message));
  refresh();
  state.timer = setInterval(refresh, POLL_MS);
}

function signOut(message) {
  clearInterval(state.timer);
  state.token = "";
  sessionStorage.removeItem("weir-token");
  for (const q of state.queries.values()) q.node.remove();
  state.queries.clear();
  $("#login-form").hidden = false;
  $("#logout").hidden = true;
  $("#who").textContent = "";
  $("#login-error").textContent = message || "";
}

$("#login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const token = $("#token").value.trim();
  if (token) signIn(token);
});
$("#logout").addEventListener("click", () => signOut());
if (state.token) signIn(state.token);
