/* nmbatch dashboard: polls the JSON API every 2 s and draws seven panels.
 *
 * Reads only GET dashboard/data, which answers 200 in every state of the service and
 * carries the readiness, the /stats and /centroids documents or the problems those routes
 * answer (before the first centroids, while Redis is away), so the browser logs no failed
 * request. It sends since=<version held>, so unchanged centroids are not sent again, and
 * energy_since=<last version charted>. The URL is relative to the page (/dashboard), so the
 * page works behind a path prefix. With an API key for reads, a 401 opens a form; the key
 * is kept in sessionStorage and sent as "Authorization: Bearer", never in a URL.
 * The energy by version comes from the server's history (the last 500 versions), the batch
 * size history whole from /stats' doublings; the ingestion rate and the centroid trails
 * are what this page has seen since it opened.
 * The 2-D map is a PCA of the centroids computed in the browser (pca.js), not on the server.
 * The k panel draws the last POST sweep the server answered (held-out energy by k).
 * Exposed for tests: window.NmbDashboard = {pca2, tinyThreshold, state, poll, charts}.
 */
(function () {
  "use strict";

  const POLL_MS = 2000;
  const KEY_STORE = "nmbatch.apiKey";
  const TRAIL_VERSIONS = 5; // previous centroid versions traced on the map
  const HISTORY = 300; // points kept per time series seen by the page
  const ENERGY_POINTS = 500; // energy points kept (the server keeps as many)
  const SVG_NS = "http://www.w3.org/2000/svg";

  const state = {
    stats: null, centroids: null, health: null,
    centroidsProblem: null, statsProblem: null, ready: null, polling: false,
    lastOk: null, unreachable: null, failed: null, needKey: false,
    ingest: { t: [], rate: [], n: [] }, prevIngest: null,
    energy: new Map(), trail: [], axes: null, timer: null, sweep: null,
  };

  const { pca2, tinyThreshold, dot } = window.NmbPca; // pca.js

  // -- formatting ------------------------------------------------------------------------
  const int = (n) => Math.round(n).toLocaleString("en-US");
  const num = (x, digits = 4) => (x === null || x === undefined ? "–" : Number(x).toPrecision(digits));
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : String(v)) + " " + units[i];
  }
  const ms = (s) => (s === null || s === undefined ? "–" : (1000 * s).toFixed(s < 0.01 ? 2 : 1) + " ms");
  const clock = (t) => new Date(t).toLocaleTimeString("en-GB");

  function fig(id, text, value, flag) {
    const el = document.getElementById(id);
    el.textContent = text;
    if (value === undefined || value === null) delete el.dataset.value;
    else el.dataset.value = String(value);
    if (flag) el.dataset.flag = flag; else delete el.dataset.flag;
  }

  // -- API -------------------------------------------------------------------------------
  class Refused extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || "HTTP " + status);
      this.status = status;
      this.problem = problem || {};
    }
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = "Bearer " + key;
    const response = await fetch(path, { headers, cache: "no-store" });
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) throw new Refused(response.status, body);
    return body;
  }

  // -- polling ---------------------------------------------------------------------------
  async function poll() {
    clearTimeout(state.timer);
    if (state.needKey || state.polling) return;
    state.polling = true;
    const query = new URLSearchParams();
    if (state.centroids) query.set("since", String(state.centroids.version));
    if (state.energy.size) query.set("energy_since", String(Math.max(...state.energy.keys())));
    try {
      take(await api("dashboard/data" + (query.toString() ? "?" + query : "")));
    } catch (error) {
      state.polling = false;
      if (error instanceof Refused && error.status === 401) return askForKey();
      if (error instanceof Refused) { state.failed = error.message; state.unreachable = null; }
      else { state.unreachable = state.unreachable || Date.now(); state.unreachableWhy = error.message; }
    }
    state.polling = false;
    render();
    state.timer = setTimeout(poll, POLL_MS);
  }

  function take(data) {
    state.unreachable = null;
    state.failed = null;
    state.lastOk = Date.now();
    state.health = data;
    state.ready = data.ready;
    state.statsProblem = data.stats_problem;
    if (data.stats) { state.stats = data.stats; recordIngestion(data.stats); }
    state.centroidsProblem = data.centroids_problem;
    if (data.centroids) takeCentroids(data.centroids);
    state.sweep = data.sweep || null;
    for (const point of data.energy_history) state.energy.set(point.version, point.energy);
    const old = [...state.energy.keys()].sort((a, b) => a - b).slice(0, -ENERGY_POINTS);
    for (const v of old) state.energy.delete(v);
  }

  function takeCentroids(doc) {
    const previous = state.centroids;
    if (previous && previous.version !== doc.version && previous.k === doc.k && previous.dim === doc.dim) {
      state.trail.push({ version: previous.version, rows: previous.centroids });
      if (state.trail.length > TRAIL_VERSIONS) state.trail.shift();
    } else if (previous && (previous.k !== doc.k || previous.dim !== doc.dim)) {
      state.trail = [];
      state.axes = null;
    }
    state.centroids = doc;
    const pca = pca2(doc.centroids, state.axes);
    state.axes = pca.axes;
    state.pca = pca;
  }

  function recordIngestion(stats) {
    const now = Date.now() / 1000;
    const prev = state.prevIngest;
    state.prevIngest = { t: now, n: stats.n_ingested };
    if (!prev || now - prev.t < 0.2) return;
    const series = state.ingest;
    series.t.push(now);
    series.rate.push(Math.max(0, (stats.n_ingested - prev.n) / (now - prev.t)));
    series.n.push(stats.n_samples);
    if (series.t.length > HISTORY) for (const s of Object.values(series)) s.shift();
  }

  // -- API key ---------------------------------------------------------------------------
  function askForKey() {
    const refused = sessionStorage.getItem(KEY_STORE) !== null;
    state.needKey = true;
    const error = document.getElementById("key-error");
    error.hidden = !refused;
    error.textContent = refused ? "The service refused this key (401)." : "";
    document.getElementById("key-overlay").hidden = false;
    document.getElementById("api-key").focus();
    setStatus("key", "API key needed");
  }

  function useKey(event) {
    event.preventDefault();
    const input = document.getElementById("api-key");
    const key = input.value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY_STORE, key);
    input.value = "";
    document.getElementById("key-overlay").hidden = true;
    state.needKey = false;
    poll();
  }

  function forgetKey() {
    sessionStorage.removeItem(KEY_STORE);
    state.needKey = false;
    poll();
  }

  // -- rendering -------------------------------------------------------------------------
  function setStatus(kind, text) {
    const pill = document.getElementById("status");
    pill.dataset.state = kind;
    pill.textContent = text;
  }

  function notice(level, text) {
    const el = document.getElementById("notice");
    el.hidden = !text;
    el.textContent = text || "";
    if (level) el.dataset.level = level; else delete el.dataset.level;
  }

  function redisAway() {
    if (state.ready && state.ready.redis !== "ok") return state.ready.redis;
    const p = state.statsProblem;
    if (p && p.status === 503) return p.detail;
    if (state.health && !state.health.redis_up) return "the worker cannot reach Redis";
    return null;
  }

  function render() {
    document.getElementById("key-button").hidden = sessionStorage.getItem(KEY_STORE) === null;
    const since = state.lastOk ? " Showing the last data received, at " + clock(state.lastOk) + "." : "";
    const away = redisAway();
    if (state.unreachable) {
      setStatus("down", "service unreachable");
      notice("bad", "The service does not answer (" + (state.unreachableWhy || "no connection") + ")." + since);
    } else if (state.failed) {
      setStatus("down", "service error");
      notice("bad", "The service answered with an error: " + state.failed + "." + since);
    } else if (away) {
      setStatus("down", "Redis unreachable");
      notice("bad", "Redis is unreachable: " + away + ". Ingestion and /stats wait for it; " +
        "the centroids shown are the last ones served." + since);
    } else if (!state.centroids) {
      setStatus("waiting", "no centroids yet");
      notice(null, state.centroidsProblem ? "No centroids yet: " + state.centroidsProblem.detail : "");
    } else {
      setStatus("ok", state.stats ? state.stats.phase : "ready");
      notice(null, "");
    }
    const s = state.stats, c = state.centroids;
    const name = state.health && state.health.model ? `model ${state.health.model} · ` : "";
    document.getElementById("model-line").textContent = s
      ? name + `role ${s.role} · retention ${s.retention}` + (c ? ` · k ${c.k} · d ${c.dim}` : "") : "";
    document.getElementById("updated").textContent = state.lastOk ? "updated " + clock(state.lastOk) : "";
    if (s) renderStats(s);
    renderSweep(state.sweep);
    renderHealth(state.health, s);
    renderClusters();
    renderMap();
  }

  function renderStats(s) {
    const rates = state.ingest.rate;
    const rate = rates.length ? rates[rates.length - 1] : null;
    fig("fig-rate", rate === null ? "–" : int(rate) + " /s", rate === null ? null : rate);
    fig("fig-n-samples", int(s.n_samples), s.n_samples);
    fig("fig-n-ingested", int(s.n_ingested), s.n_ingested);
    const full = s.max_samples ? s.n_samples / s.max_samples : null;
    fig("fig-capacity", s.max_samples ? int(s.max_samples) + " (" + (100 * full).toFixed(1) + "% used)" : "–",
      s.max_samples, full !== null && full > 0.9 ? "warn" : null);
    fig("fig-b", int(s.b), s.b);
    fig("fig-iteration", int(s.iteration), s.iteration);
    fig("fig-doublings", int(s.doublings.length), s.doublings.length);
    fig("fig-converged", s.converged ? "yes" : "no", s.converged, s.converged ? "good" : null);
    fig("fig-energy", num(s.energy), s.energy);
    fig("fig-version", s.version === null ? "–" : int(s.version), s.version);
    fig("fig-iteration-seconds", ms(s.last_iteration_seconds), s.last_iteration_seconds);
    const ingest = state.ingest;
    charts.ingestion.setData([ingest.t, ingest.rate, ingest.n]);
    charts.batch.setData(batchSeries(s));
    const versions = [...state.energy.keys()].sort((a, b) => a - b);
    charts.energy.setData([versions, versions.map((v) => state.energy.get(v))]);
    placeholder("chart-energy", versions.length ? null : "No energy yet: it comes with the first iteration.");
    placeholder("chart-batch", s.b ? null : "No batch yet: the first iteration needs k samples.");
  }

  function renderSweep(sweep) { // the last POST sweep: held-out energy by k, the elbow marked
    if (!sweep) {
      charts.sweep.setData([[], [], []]);
      fig("fig-sweep-k", "–", null);
      fig("fig-sweep-rows", "–", null);
      fig("fig-sweep-seconds", "–", null);
      placeholder("chart-sweep", 'No sweep yet: POST sweep {"ks": [8, 16, 32, 64]} draws the curve here.');
      return;
    }
    const ks = sweep.points.map((p) => p.k);
    const energy = sweep.points.map((p) => p.heldout_energy);
    const marks = sweep.points.map((p) => (p.k === sweep.recommended_k ? p.heldout_energy : null));
    charts.sweep.setData([ks, energy, marks]);
    const k = sweep.recommended_k;
    fig("fig-sweep-k", k === null ? "none" : int(k), k);
    fig("fig-sweep-rows", int(sweep.n_train), sweep.n_train);
    fig("fig-sweep-seconds", sweep.seconds.toFixed(2) + " s", sweep.seconds);
    placeholder("chart-sweep", null);
  }

  function batchSeries(s) { // b over iterations as steps, doublings as points
    const x = [0], b = [], marks = [null];
    const first = s.doublings.length ? s.doublings[0].from_b : s.b;
    b.push(first);
    for (const e of s.doublings) { x.push(e.iteration); b.push(e.to_b); marks.push(e.to_b); }
    if (s.iteration > x[x.length - 1]) { x.push(s.iteration); b.push(s.b); marks.push(null); }
    return s.b ? [x, b, marks] : [[], [], []];
  }

  function renderHealth(h, s) {
    if (h) {
      const lat = h.assign_latency;
      fig("fig-p50", ms(lat.p50), lat.p50);
      fig("fig-p90", ms(lat.p90), lat.p90);
      fig("fig-p99", ms(lat.p99), lat.p99);
      fig("fig-assign-count", int(lat.count), lat.count);
      fig("fig-server-errors", int(h.server_errors), h.server_errors, h.server_errors ? "bad" : "good");
      fig("fig-assign-errors", int(h.assign_errors), h.assign_errors, h.assign_errors ? "bad" : "good");
      fig("fig-client-errors", int(h.client_errors), h.client_errors);
      fig("fig-redis-unavailable", int(h.redis_unavailable), h.redis_unavailable, h.redis_unavailable ? "warn" : null);
      fig("fig-rss", bytes(h.server_rss_bytes), h.server_rss_bytes);
    }
    const away = redisAway();
    fig("fig-redis", away ? "unreachable" : state.ready ? "up" : "–", away ? 0 : 1, away ? "bad" : "good");
    if (s) {
      fig("fig-engine-bytes", bytes(s.engine_bytes), s.engine_bytes);
      const used = s.redis_used_memory;
      fig("fig-redis-memory", bytes(used) + (s.redis_maxmemory ? " of " + bytes(s.redis_maxmemory) : ""), used);
      fig("fig-skipped", s.skipped_share === null ? "–" : (100 * s.skipped_share).toFixed(1) + "%", s.skipped_share);
    }
  }

  function placeholder(containerId, text) {
    const box = document.getElementById(containerId);
    let el = box.querySelector(".placeholder");
    if (!text) { if (el) el.remove(); box.closest(".panel").dataset.empty = "false"; return; }
    if (!el) { el = document.createElement("div"); el.className = "placeholder"; box.appendChild(el); }
    el.textContent = text;
    box.closest(".panel").dataset.empty = "true";
  }

  function svgEl(name, attrs, parent) {
    const el = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    if (parent) parent.appendChild(el);
    return el;
  }

  function freshSvg(containerId) {
    const box = document.getElementById(containerId);
    const old = box.querySelector("svg");
    if (old) old.remove();
    const w = Math.max(box.clientWidth, 120), h = Math.max(box.clientHeight, 120);
    const svg = svgEl("svg", { viewBox: `0 0 ${w} ${h}`, width: w, height: h });
    box.insertBefore(svg, box.firstChild);
    return { svg, w, h };
  }

  function noCentroidsText() {
    const p = state.centroidsProblem;
    return "No centroids yet" + (p ? ": " + p.detail : ".");
  }

  function renderClusters() {
    const c = state.centroids;
    if (!c) {
      placeholder("clusters", noCentroidsText());
      for (const id of ["fig-k", "fig-empty", "fig-tiny", "fig-largest"]) fig(id, "–", null);
      return;
    }
    placeholder("clusters", null);
    const counts = c.counts, k = counts.length;
    const order = counts.map((_, j) => j).sort((a, b) => counts[b] - counts[a] || a - b);
    const tiny = tinyThreshold(counts), max = Math.max(1, counts[order[0]]);
    const nEmpty = counts.filter((v) => v === 0).length;
    const nTiny = counts.filter((v) => v > 0 && v < tiny).length;
    fig("fig-k", int(k), k);
    fig("fig-empty", int(nEmpty), nEmpty, nEmpty ? "bad" : "good");
    fig("fig-tiny", int(nTiny), nTiny, nTiny ? "warn" : "good");
    fig("fig-largest", int(counts[order[0]]), counts[order[0]]);
    const { svg, w, h } = freshSvg("clusters");
    const left = 44, right = 6, top = 8, bottom = 18;
    const plotW = w - left - right, plotH = h - top - bottom, step = plotW / k;
    const y = (v) => top + plotH * (1 - v / max);
    svgEl("line", { x1: left, x2: left + plotW, y1: y(0), y2: y(0), class: "axis" }, svg);
    for (const v of [0, max]) {
      svgEl("text", { x: left - 4, y: y(v) + 3, "text-anchor": "end", class: "axis-label" }, svg).textContent = int(v);
    }
    if (tiny > 0) {
      svgEl("line", { x1: left, x2: left + plotW, y1: y(tiny), y2: y(tiny), class: "axis", "stroke-dasharray": "3 3" }, svg);
    }
    svgEl("text", { x: left + plotW / 2, y: h - 4, "text-anchor": "middle", class: "axis-label" }, svg)
      .textContent = "clusters by size (" + int(k) + ")";
    order.forEach((j, i) => {
      const v = counts[j];
      const cls = v === 0 ? "bar empty-mark" : v < tiny ? "bar tiny" : "bar";
      const height = v === 0 ? 3 : Math.max(1, y(0) - y(v));
      const rect = svgEl("rect", {
        x: left + i * step + Math.min(1, step * 0.1), y: y(0) - height,
        width: Math.max(1, step - Math.min(2, step * 0.2)), height,
        class: cls, "data-cluster": j, "data-count": v,
      }, svg);
      svgEl("title", {}, rect).textContent = `cluster ${j}: ${int(v)}` + (v === 0 ? " (empty)" : v < tiny ? " (tiny)" : "");
    });
  }

  function renderMap() {
    const c = state.centroids, pca = state.pca;
    if (!c || !pca) {
      placeholder("map", noCentroidsText());
      for (const id of ["fig-explained", "fig-drift", "fig-trail"]) fig(id, "–", null);
      return;
    }
    placeholder("map", null);
    const project = (row) => {
      const x = row.map((v, i) => v - pca.mean[i]);
      return [dot(x, pca.axes[0]), dot(x, pca.axes[1])];
    };
    const trails = state.trail.map((t) => t.rows.map(project));
    const points = [...pca.scores, ...trails.flat()];
    let [x0, x1, y0, y1] = [Infinity, -Infinity, Infinity, -Infinity];
    for (const [a, b] of points) { x0 = Math.min(x0, a); x1 = Math.max(x1, a); y0 = Math.min(y0, b); y1 = Math.max(y1, b); }
    const { svg, w, h } = freshSvg("map");
    const rMax = Math.max(6, Math.min(w, h) / 14), pad = rMax + 4;
    const span = Math.max(x1 - x0, y1 - y0, 1e-12);
    const scale = Math.min((w - 2 * pad) / span, (h - 2 * pad) / span);
    const cx = (w - scale * (x1 + x0)) / 2, cy = (h + scale * (y1 + y0)) / 2;
    const sx = (a) => cx + scale * a, sy = (b) => cy - scale * b;
    const counts = c.counts, maxCount = Math.max(1, ...counts), tiny = tinyThreshold(counts);
    pca.scores.forEach((p, j) => {
      const path = [...trails.map((t) => t[j]), p];
      if (path.length > 1) {
        svgEl("polyline", { points: path.map(([a, b]) => `${sx(a).toFixed(1)},${sy(b).toFixed(1)}`).join(" "), class: "trail" }, svg);
        svgEl("circle", { cx: sx(path[0][0]), cy: sy(path[0][1]), r: 2, class: "trail-start" }, svg);
      }
    });
    const order = counts.map((_, j) => j).sort((a, b) => counts[b] - counts[a]); // small ones on top
    for (const j of order) {
      const [a, b] = pca.scores[j], v = counts[j];
      const r = 3 + (rMax - 3) * Math.sqrt(v / maxCount);
      const circle = svgEl("circle", {
        cx: sx(a).toFixed(2), cy: sy(b).toFixed(2), r: r.toFixed(2),
        class: "centroid" + (v === 0 ? " empty" : v < tiny ? " tiny" : ""),
        "data-centroid": j, "data-count": v, "data-pc1": a, "data-pc2": b,
      }, svg);
      svgEl("title", {}, circle).textContent = `centroid ${j}: ${int(v)} samples`;
      if (counts.length <= 40) {
        svgEl("text", { x: sx(a) + r + 2, y: sy(b) + 3, class: "centroid-label" }, svg).textContent = String(j);
      }
    }
    fig("fig-explained", (100 * pca.explained).toFixed(1) + "%", pca.explained);
    const last = state.trail[state.trail.length - 1];
    if (last) {
      const drift = c.centroids.reduce((sum, row, j) =>
        sum + Math.sqrt(row.reduce((s, v, i) => s + (v - last.rows[j][i]) ** 2, 0)), 0) / c.k;
      fig("fig-drift", num(drift, 3) + " since v" + last.version, drift);
    } else fig("fig-drift", "–", null);
    fig("fig-trail", int(state.trail.length + 1), state.trail.length + 1);
  }

  // -- charts (uPlot) --------------------------------------------------------------------
  const charts = {};

  function chart(id, opts, series) {
    const box = document.getElementById(id);
    const size = () => ({ width: Math.max(box.clientWidth, 120), height: Math.max(box.clientHeight, 120) });
    const plot = new uPlot({ ...size(), legend: { show: false }, ...opts }, series, box);
    new ResizeObserver(() => plot.setSize(size())).observe(box);
    return plot;
  }

  function setUpCharts() {
    const blue = "#2563eb", grey = "#94a3b8", red = "#dc2626";
    charts.ingestion = chart("chart-ingestion", {
      scales: { x: { time: true }, n: {} },
      series: [{}, { label: "samples/s", stroke: blue, width: 2, scale: "rate" },
        { label: "N", stroke: grey, width: 1.5, scale: "n" }],
      axes: [{}, { scale: "rate", label: "samples/s", size: 60 },
        { scale: "n", side: 1, label: "N", size: 60, grid: { show: false } }],
    }, [[], [], []]);
    charts.batch = chart("chart-batch", {
      scales: { x: { time: false }, y: { distr: 3, log: 2 } },
      series: [{ label: "iteration" },
        { label: "b", stroke: blue, width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } },
        { label: "doubling", stroke: red, width: 0, paths: () => null, points: { show: true, size: 7, fill: red } }],
      axes: [{ label: "iteration" }, { label: "b (log scale)", size: 60 }],
    }, [[], [], []]);
    charts.energy = chart("chart-energy", {
      scales: { x: { time: false } },
      series: [{ label: "version" }, { label: "energy", stroke: blue, width: 2, points: { show: true, size: 4 } }],
      axes: [{ label: "centroid version" }, { label: "energy", size: 60 }],
    }, [[], []]);
  }

  function setUpSweepChart() {
    const blue = "#2563eb", red = "#dc2626";
    charts.sweep = chart("chart-sweep", {
      scales: { x: { time: false, distr: 3, log: 2 }, y: { distr: 3, log: 10 } },
      series: [{ label: "k" },
        { label: "held-out energy", stroke: blue, width: 2, points: { show: true, size: 5 } },
        { label: "recommended", stroke: red, width: 0, paths: () => null, points: { show: true, size: 9, fill: red } }],
      axes: [{ label: "k (log scale)" }, { label: "held-out energy (log)", size: 60 }],
    }, [[], [], []]);
  }

  function start() {
    setUpCharts();
    setUpSweepChart();
    document.getElementById("key-form").addEventListener("submit", useKey);
    document.getElementById("key-button").addEventListener("click", forgetKey);
    document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
    poll();
  }

  window.NmbDashboard = { pca2, tinyThreshold, state, poll, charts };
  start();
})();
