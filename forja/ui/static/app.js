// forja ui: reads the dashboard's JSON endpoints and draws them. Figures arrive formatted for people
// by the server (forja.format, the one home of those rules, under `shown`); the charts use the raw
// numbers. Text goes in with textContent only: nothing a run reports is ever parsed as HTML.
"use strict";

const LIVE_MS = 1000, RUNS_MS = 5000, VM_MS = 30000;
const state = { selected: null, chosenByHand: false, runs: [], live: {}, points: {}, since: 0, charts: null, chartRun: null };

// The token: taken from the URL `forja ui` printed, kept in this tab's sessionStorage (which only
// this origin, port included, can read), sent as a header, and taken out of the address bar. Never
// a cookie: browsers send cookies to every port of 127.0.0.1, so another local server would get it.
const TOKEN_KEY = "forja-ui-token";
const TOKEN = (() => {
  const url = new URL(window.location.href);
  const given = url.searchParams.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  return sessionStorage.getItem(TOKEN_KEY);
})();

async function fetchWithToken(path) {
  const response = await fetch(path, {
    headers: TOKEN ? { Authorization: `token ${TOKEN}` } : {}, credentials: "omit", cache: "no-store",
  });
  if (response.status === 403) {
    document.getElementById("updated").textContent = "open the URL `forja ui` printed (it has ?token=...)";
  }
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response;
}

async function get(path) {
  return (await fetchWithToken(path)).json();
}

function make(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells, numeric = []) {
  const tr = document.createElement("tr");
  cells.forEach((value, i) => {
    const td = value instanceof Node ? wrap("td", value) : make("td", value);
    if (numeric.includes(i)) td.classList.add("num");
    tr.appendChild(td);
  });
  return tr;
}

function wrap(tag, child) {
  const node = document.createElement(tag);
  node.appendChild(child);
  return node;
}

function badge(text) {
  return make("span", text, `badge ${text}`);
}

// -- the VMs ---------------------------------------------------------------------------------------
async function refreshVms() {
  const box = document.getElementById("vms");
  try {
    const vm = await get("/api/vm");
    box.replaceChildren();
    if (vm.error) {
      box.appendChild(make("p", vm.error, "muted"));
      return;
    }
    for (const line of vm.instances) {
      const card = make("div", null, "card");
      const title = make("h4", `${line.name} `);
      title.appendChild(badge(line.status));
      card.appendChild(title);
      const figures = make("dl", null, "figures");
      for (const [label, value] of line.shown) figures.appendChild(figure(label, value));
      card.appendChild(figures);
      box.appendChild(card);
    }
    if (!vm.instances.length) box.appendChild(make("p", "no VM in the inventory", "muted"));
  } catch (error) {
    box.replaceChildren(make("p", `VM state unavailable: ${error.message}`, "muted"));
  }
}

function figure(label, value) {
  const item = document.createElement("div");
  item.appendChild(make("dt", label));
  item.appendChild(make("dd", value === "" || value === null ? "–" : value));
  return item;
}

// -- the runs --------------------------------------------------------------------------------------
async function refreshRuns() {
  const data = await get("/api/runs");
  state.runs = data.runs;
  drawRuns();
}

function drawRuns() {
  const body = document.querySelector("#runs tbody");
  const known = new Set(state.runs.map((r) => r.run_id));
  const rows = [...state.runs];
  for (const [name, live] of Object.entries(state.live)) {  // serving, but not in this history
    if (!known.has(name)) rows.unshift({ run_id: name, status: "running", shown: { started: "", steps: "", loss: "", cost: "" }, preemptions: "", zone_moves: "", liveOnly: true });
  }
  body.replaceChildren();
  if (!rows.length) body.appendChild(row(["no runs yet: forja train CONFIG", "", "", "", "", "", "", "", ""]));
  for (const run of rows) {
    const live = state.live[run.run_id];
    const serving = live && live.latest.serving;
    const step = serving ? live.latest.shown.step : run.shown.steps;
    const loss = serving ? live.latest.shown.loss : run.shown.loss;
    const tr = row([run.run_id, badge(run.status), run.shown.started, step, loss, run.shown.cost,
      run.preemptions, run.zone_moves, serving ? make("span", "", "dot") : ""], [3, 4, 5, 6, 7]);
    tr.dataset.run = run.run_id;
    if (run.run_id === state.selected) tr.classList.add("selected");
    tr.addEventListener("click", () => select(run.run_id, true));
    body.appendChild(tr);
  }
  if (!state.chosenByHand) {
    const servingRun = rows.find((r) => state.live[r.run_id] && state.live[r.run_id].latest.serving);
    const first = servingRun || rows[0];
    if (first && first.run_id !== state.selected) select(first.run_id, false);
  }
}

async function select(name, byHand) {
  state.selected = name;
  state.chosenByHand = state.chosenByHand || byHand;
  document.querySelectorAll("#runs tbody tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.run === name));
  document.getElementById("run-section").hidden = false;
  document.getElementById("run-name").textContent = name;
  drawLive();
  await refreshDetail();
}

// -- one run's details -----------------------------------------------------------------------------
async function refreshDetail() {
  const name = state.selected;
  if (!name) return;
  const record = state.runs.find((r) => r.run_id === name);
  document.getElementById("run-status").textContent = record ? record.status : "running";
  document.getElementById("run-status").className = `badge ${record ? record.status : "running"}`;
  if (!record) return;  // a run serving metrics that this history has not recorded
  let detail;
  try {
    detail = await get(`/api/runs/${encodeURIComponent(name)}`);
  } catch (error) {
    return;
  }
  if (state.selected !== name) return;
  const cost = document.querySelector("#cost tbody");
  cost.replaceChildren();
  const note = document.getElementById("cost-note");
  if (typeof detail.cost === "string") {
    note.textContent = detail.cost;
  } else {
    cost.appendChild(row(["part", "time", "cost", "share"]));
    for (const cells of detail.cost.shown.rows) {
      const tr = row(cells, [1, 2, 3]);
      if (cells[0] === "total") tr.classList.add("total");
      cost.appendChild(tr);
    }
    note.textContent = detail.cost.shown.note;
  }
  const events = document.querySelector("#events tbody");
  events.replaceChildren();
  for (const event of detail.events) events.appendChild(row([event.shown.time, event.kind, event.shown.text]));
  const plots = document.getElementById("plots");
  plots.replaceChildren();
  if (!detail.plots.length) {
    plots.appendChild(make("p", "none fetched yet (forja fetch NAME, or at the end of forja train)", "muted"));
  }
  for (const plot of detail.plots) {
    const img = make("img");
    img.alt = `${name}: ${plot}`;
    plots.appendChild(img);
    // fetched with the token header, then shown from memory: an <img src> could only carry a cookie
    fetchWithToken(`/api/runs/${encodeURIComponent(name)}/plots/${encodeURIComponent(plot)}`)
      .then((response) => response.blob())
      .then((blob) => { img.src = URL.createObjectURL(blob); })
      .catch(() => { img.alt = `${plot}: not loaded`; });
  }
}

// -- live metrics ----------------------------------------------------------------------------------
async function refreshLive() {
  const data = await get(`/api/live?since=${state.since}`);
  state.since = data.now;
  for (const [name, run] of Object.entries(data.runs)) {
    state.live[name] = { latest: run.latest };
    state.points[name] = (state.points[name] || []).concat(run.points).slice(-3600);
  }
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  drawLive();
}

function drawLive() {
  const name = state.selected;
  const live = name && state.live[name];
  document.getElementById("live").hidden = !live;
  document.getElementById("charts").hidden = !live;
  if (!live) return;
  const shown = live.latest.shown;
  document.getElementById("live-step").textContent = shown.step;
  document.getElementById("live-fraction").textContent = shown.fraction;
  const phase = document.getElementById("live-phase");
  phase.textContent = live.latest.serving ? shown.phase : "not serving";
  phase.className = `badge ${live.latest.serving ? shown.phase : "stopped"}`;
  document.getElementById("live-bar").style.width = `${(live.latest.fraction || 0) * 100}%`;
  const figures = document.getElementById("live-figures");
  figures.replaceChildren();
  for (const [label, value] of shown.figures) figures.appendChild(figure(label, value));
  document.getElementById("live-note").textContent = live.latest.serving ? `from ${live.latest.url}` : "the run stopped serving metrics (ended, or the tunnel is down)";
  drawCharts(name);
}

function drawCharts(name) {
  const points = state.points[name] || [];
  if (state.charts === null || state.chartRun !== name) {
    for (const id of ["chart-loss", "chart-speed", "chart-util"]) document.getElementById(id).replaceChildren();
    const room = document.getElementById("charts").clientWidth - 2 * 12 - 3 * 18;  // gaps, padding, borders
    const width = Math.max(300, Math.floor(room / 3));
    // Tick labels with 3 significant digits (a loss near 0.001 keeps its digits; a rate of 14,322
    // samples/s reads as such), thousands separated.
    const tick = (v) => (v === null ? "" : Math.abs(v) >= 1000 ? Math.round(v).toLocaleString()
      : Number(v.toPrecision(3)).toString());
    const opts = (title, xTime, series, y = {}) => ({
      width, height: 220, scales: { x: { time: xTime }, y },
      axes: [{}, { size: 60, values: (u, splits) => splits.map(tick) }],
      series: [{ label: xTime ? "time" : "step" }, ...series.map(([label, color]) => ({ label, stroke: color, width: 2, spanGaps: true }))],
    });
    state.charts = {
      loss: new uPlot(opts("loss", false, [["loss", "#dc2626"]]), [[], []], document.getElementById("chart-loss")),
      speed: new uPlot(opts("samples/s", true, [["samples/s", "#2563eb"]]), [[], []], document.getElementById("chart-speed")),
      util: new uPlot(opts("%", true, [["CPU %", "#16a34a"], ["GPU %", "#9333ea"]], { range: [0, 100] }), [[], [], []], document.getElementById("chart-util")),
    };
    state.chartRun = name;
  }
  // The loss gauge changes at log steps only (and reads 0 before the first): one point per new value.
  const bySteps = new Map();
  let previous = null;
  for (const p of points) {
    if (p.step === null || p.loss === null || !p.samples_per_second || p.loss === previous) continue;
    bySteps.set(p.step, p.loss);
    previous = p.loss;
  }
  const steps = [...bySteps.keys()].sort((a, b) => a - b);
  state.charts.loss.setData([steps, steps.map((s) => bySteps.get(s))]);
  const times = points.map((p) => p.t);
  state.charts.speed.setData([times, points.map((p) => p.samples_per_second)]);
  const percent = (v) => (v === null || v === undefined ? null : v * 100);
  state.charts.util.setData([times, points.map((p) => percent(p.cpu)), points.map((p) => percent(p.gpu))]);
}

// -- the sweeps (forja sweep): each a table of its trials, the best in bold --------------------------
async function refreshSweeps() {
  const data = await get("/api/sweeps");
  const box = document.getElementById("sweeps");
  document.getElementById("sweeps-section").hidden = !data.sweeps.length;
  box.replaceChildren();
  for (const sweep of data.sweeps) {
    box.appendChild(make("h3", `${sweep.name}: ${sweep.metrics.join(", ")} (${sweep.directions.join(", ")})${sweep.stopped ? "; " + sweep.stopped : ""}`));
    const table = make("table");
    table.appendChild(wrap("thead", row(["trial", "run", "parameters", "value", "state", "cost", ""])));
    const body = make("tbody");
    for (const trial of sweep.shown) {
      const tr = row([trial.trial, trial.run, trial.params, trial.value, badge(trial.state), trial.cost, trial.best || trial.why], [0, 3, 5]);
      if (trial.best) tr.classList.add("selected");
      body.appendChild(tr);
    }
    table.appendChild(body);
    box.appendChild(table);
  }
}

// -- the loops -------------------------------------------------------------------------------------
function every(ms, work) {
  const tick = async () => {
    try { await work(); } catch (error) { document.getElementById("updated").textContent = `not updated: ${error.message}`; }
    setTimeout(tick, ms);
  };
  tick();
}

every(LIVE_MS, refreshLive);
every(RUNS_MS, async () => { await refreshRuns(); await refreshDetail(); });
every(VM_MS, refreshVms);
every(RUNS_MS, refreshSweeps);
