// The live view of the engine: reads /engine/events (an EngineSnapshot per event, a few a second),
// writes each figure into the element whose data-metric names it, and adds each snapshot to the
// charts (charts.js) as their newest point.

import { Chart, ShareBar } from "./charts.js";
import { apiKey, el, errorText, headers, readEvents } from "./common.js";

const $ = (id) => document.getElementById(id);
const MODEL_COLUMNS = ["running", "waiting", "tokens_per_s", "steps", "kv_used", "kv_cached", "kv_free",
  "prefix_hits", "restarts"];
const mib = (bytes) => (bytes / 1048576).toFixed(1);
const COLORS = ["#3182ce", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#718096"];
const percent = (ratio) => `${(100 * ratio).toFixed(1)}%`;

// The charts by name: window.llamactorCharts[name].data holds each one's points (charts.js).
const charts = {
  tokens: new Chart("tokens", $("chart-tokens"), [
    { key: "tokens_per_s", label: "generated", color: COLORS[0] },
    { key: "prompt_tokens_per_s", label: "prompt", color: COLORS[1] }]),
  sequences: new Chart("sequences", $("chart-sequences"), [
    { key: "running", label: "running", color: COLORS[0] }, { key: "waiting", label: "waiting", color: COLORS[1] }]),
  kv: new Chart("kv", $("chart-kv"), [{ key: "kv_use", label: "used", color: COLORS[0] },
    { key: "kv_cached_use", label: "of which cached prefixes", color: COLORS[3] }], { max: 1, format: percent }),
  cache: new Chart("cache", $("chart-cache"), [
    { key: "prefix_hits_per_s", label: "hits / s", color: COLORS[2] }]),
  rows: new Chart("rows", $("chart-rows"), ["decode", "prefill", "scoring", "embedding"].map((kind, i) => (
    { key: `rows_${kind}`, label: kind, color: COLORS[i] })), { stacked: true }),
  tenants: new ShareBar("tenants", $("chart-tenants")),
};
window.llamactorCharts = charts;

function chart(snapshot) {
  const now = Date.now();
  const f = snapshot.figures;
  const values = { ...f, kv_cached_use: f.kv_size ? f.kv_cached / f.kv_size : 0 };
  for (const name of ["tokens", "sequences", "kv", "cache", "rows"]) charts[name].push(now, values);
  if (snapshot.tenants) {  // an admin's stream (or a daemon without keys) carries the tenants' shares
    $("tenant-shares").hidden = false;
    charts.tenants.show(snapshot.tenants, COLORS);
  }
}

function show(figures) {
  const values = { ...figures, ram_mib: mib(figures.ram_bytes), disk_mib: mib(figures.disk_bytes) };
  for (const node of document.querySelectorAll(".engine [data-metric]")) {
    if (node.closest("#models, #jobs")) continue;
    const value = values[node.dataset.metric];
    if (value !== undefined) node.textContent = String(value);
  }
  const size = figures.kv_size || 1;
  $("kv-running").style.width = `${(100 * (figures.kv_used - figures.kv_cached)) / size}%`;
  $("kv-cached").style.width = `${(100 * figures.kv_cached) / size}%`;
}

function modelRows(models) {
  const head = el("tr", {}, el("th", {}, "model"), el("th", {}, "state"), ...MODEL_COLUMNS.map((c) => el("th", {}, c)));
  const rows = models.flatMap((model) => [model, ...(model.replicas.length > 1 ? model.replicas.map((r) => ({
    name: `${model.name} #${r.replica}`, state: r.state, figures: r.figures })) : [])]);
  $("models").replaceChildren(head, ...rows.map((m) => el("tr", { "data-model": m.name },
    el("td", {}, m.name), el("td", { "data-metric": "model.state" }, m.state),
    ...MODEL_COLUMNS.map((c) => el("td", { "data-metric": `model.${c}` }, String(m.figures[c]))))));
}

function jobRows(jobs) {
  const head = el("tr", {}, ...["batch", "status", "endpoint", "completed", "failed", "total"].map((c) => el("th", {}, c)));
  $("jobs").replaceChildren(head, ...(jobs.length ? jobs.map((j) => el("tr", { "data-job": j.id },
    el("td", {}, j.id), el("td", {}, j.status), el("td", {}, j.endpoint),
    el("td", { "data-metric": "job.completed" }, String(j.completed)),
    el("td", { "data-metric": "job.failed" }, String(j.failed)),
    el("td", { "data-metric": "job.total" }, String(j.total)))) : [el("tr", {}, el("td", { colspan: "6" }, "none in progress"))]));
}

async function follow() {
  $("engine-error").textContent = "";
  try {
    const response = await fetch("/engine/events", { headers: headers() });
    if (!response.ok) {
      const words = await errorText(response);
      $("engine-error").textContent = apiKey() ? words : `${words} (enter an admin key on the chat page)`;
      $("status").textContent = "refused";
      return;  // a refusal does not change by asking again
    }
    $("status").textContent = "live";
    await readEvents(response, (data) => {
      const snapshot = JSON.parse(data);
      show(snapshot.figures);
      chart(snapshot);
      modelRows(snapshot.models);
      jobRows(snapshot.jobs);
      document.body.dataset.updated = String(Date.now());
    });
    $("status").textContent = "the server ended the stream";
  } catch (error) {
    $("status").textContent = `disconnected: ${error.message || error}`;
  }
  setTimeout(follow, 2000);  // reconnect after a restart or a network hiccup
}

follow();
