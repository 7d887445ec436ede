/* microgpt dashboard: the system panel, this machine's CPU, memory and GPU over wall-clock time.
 *
 * /api/system gives the dashboard server's samples (dashboard/system.py): the page asks for the ones newer
 * than it has every POLL_MS (once, in a static snapshot) and draws two charts, CPU and memory, and GPU
 * utilisation and memory; without a GPU the second says why there is none. The MFU chart is app.js's: it
 * follows the step axis like the other per-step charts.
 */
"use strict";
window.DashSystem = (function () {
  const POLL_MS = 5000;
  const KEEP = 1800; // samples kept by the page, as many as the server keeps
  const CHARTS = {};
  const cols = { time: [], cpu_percent: [], mem_used_bytes: [], mem_total_bytes: [], gpu_util_percent: [],
    gpu_mem_used_bytes: [], gpu_mem_total_bytes: [] };
  let info = null, since = null;
  const $ = (id) => document.getElementById(id);

  const pct = (a, b) => a.map((v, i) => (v == null || !b[i] ? null : (100 * v) / b[i]));
  const fmtPct = (v) => (v == null || !isFinite(v) ? "–" : v.toFixed(1) + "%");
  const fmtClock = (t) => {
    const d = new Date(t * 1000), p2 = (v) => String(v).padStart(2, "0");
    return `${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}`;
  };

  function note(id, message) {
    const host = $(id);
    let n = host.querySelector(":scope > .chart-empty");
    if (!message) { if (n) n.remove(); return; }
    if (!n) { n = document.createElement("div"); n.className = "chart-empty"; host.append(n); }
    n.textContent = message;
  }

  function opts(host, labels, colours) {
    return {
      width: Math.max(200, host.clientWidth || 400), height: 180,
      scales: { x: { time: false }, y: { range: [0, 100] } },
      axes: [
        { values: (u, sp) => sp.map(fmtClock), grid: { stroke: "#eee" }, label: "wall clock (this machine)", labelSize: 18 },
        { values: (u, sp) => sp.map((v) => v + "%"), size: 52, grid: { stroke: "#eee" }, label: "percent", labelSize: 18 },
      ],
      legend: { live: true },
      series: [{ label: "time", value: (u, v) => (v == null ? "–" : fmtClock(v)) }].concat(labels.map((l, k) => ({
        label: l, stroke: colours[k], _color: colours[k], width: 1.5, spanGaps: false, points: { show: false },
        value: (u, v) => fmtPct(v),
      }))),
    };
  }

  function draw(id, labels, colours, data) {
    const host = $(id);
    if (!CHARTS[id]) CHARTS[id] = new uPlot(opts(host, labels, colours), data, host);
    else CHARTS[id].setData(data);
  }

  function render(fmtBytes) {
    const n = cols.time.length;
    const last = (k) => (n ? cols[k][n - 1] : null);
    const head = [`host ${info.host} (the dashboard's machine)`, `${info.cpus} CPUs`,
      `memory ${fmtBytes(last("mem_used_bytes"))} of ${fmtBytes(last("mem_total_bytes"))}`];
    head.push(info.gpu ? `GPU ${info.gpu}: ${fmtPct(last("gpu_util_percent"))} busy, ` +
      `${fmtBytes(last("gpu_mem_used_bytes"))} of ${fmtBytes(last("gpu_mem_total_bytes"))}`
      : info.no_gpu ? `no GPU (${info.no_gpu})` : "GPU not sampled yet");
    $("system-note").textContent = head.join(" · ");
    draw("chart-cpu", ["CPU", "memory"], ["#1f77b4", "#2ca02c"],
      [cols.time, cols.cpu_percent, pct(cols.mem_used_bytes, cols.mem_total_bytes)]);
    note("chart-cpu", n ? null : `no sample yet (one every ${info.every_s} s)`);
    if (info.gpu) {
      draw("chart-gpu", ["GPU utilisation", "GPU memory"], ["#d62728", "#9467bd"],
        [cols.time, cols.gpu_util_percent, pct(cols.gpu_mem_used_bytes, cols.gpu_mem_total_bytes)]);
      note("chart-gpu", null);
    } else note("chart-gpu", info.no_gpu ? "no GPU: " + info.no_gpu : "no GPU sample yet");
  }

  async function poll(fmtBytes) {
    const r = await fetch("/api/system" + (since != null ? "?since=" + since : ""), { cache: "no-store" });
    if (!r.ok) throw new Error("/api/system: HTTP " + r.status);
    info = await r.json();
    const s = info.samples;
    for (const k in cols) cols[k].push(...(s[k] || []));
    const drop = cols.time.length - KEEP;
    if (drop > 0) for (const k in cols) cols[k].splice(0, drop);
    if (cols.time.length) since = cols.time[cols.time.length - 1];
    render(fmtBytes);
  }

  /* start polling; `onError` gets any failure (the page's error list) */
  function start(isStatic, fmtBytes, onError) {
    const tick = () => poll(fmtBytes).catch(onError);
    tick();
    if (!isStatic) setInterval(tick, POLL_MS);
  }

  return { start, chart: (id) => CHARTS[id] || null, ids: ["chart-cpu", "chart-gpu"] };
})();
