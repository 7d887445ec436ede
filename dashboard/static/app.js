/* microgpt dashboard: charts over the server's downsampled series, live updates over SSE.
 *
 * Data flow: /api/runs lists the runs; for each run shown, /api/runs/N/series gives a
 * min/max-bucketed overview (at most one bucket per pixel) with the byte offset it covers;
 * /api/stream pushes log entries past that offset (and changed sidecars) as they are
 * written. A drag on a chart zooms: the server returns that step range at a finer
 * resolution. Everything inserted into the page from run files goes in as text.
 *
 * The page's other scripts, loaded before this one: format.js (formats, the element builder), points.js (a
 * run's chart points), panels.js (configuration panel, chart downloads), tables.js (status cards and the
 * focus run's tables), system.js (the system panel).
 *
 * `?static=1` draws what the server has once and opens no event stream (nothing keeps the page
 * busy), for screenshots: headless Chromium's --virtual-time-budget then finishes (DASHBOARD.md).
 */
"use strict";
(function () {
  const RUN_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  // a run's lines share its colour; its arms differ by dash pattern (validation chart)
  const ARM_DASHES = [undefined, [6, 3], [2, 2], [8, 3, 2, 3], [12, 4], [3, 5], [1, 3], [10, 2, 2, 2, 2, 2]];
  const ARM_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
    "#ff9da7", "#9c755f", "#bab0ac"];
  const MAX_SHOWN = 8;
  const STATIC = new URLSearchParams(location.search).get("static") === "1";
  // the per-step value columns (/api/columns: the step-field table's plotted fields and tok_s); a column
  // with a `chart` id gets a line chart of its own, added by addColumnCharts
  let COLUMNS = [];
  const OWN_CHARTS = () => COLUMNS.filter((c) => c.chart);
  const STEP_CHARTS = () => ["chart-loss"].concat(OWN_CHARTS().map((c) => c.chart), ["chart-tps"]);
  const CHART_IDS = () => ["chart-loss", "chart-val", "chart-mix"].concat(OWN_CHARTS().map((c) => c.chart),
    ["chart-tps", "chart-mfu"]);
  const NO_STEPS = "no training steps logged yet";
  const $ = (id) => document.getElementById(id);

  const dash = (window.__dashboard = {
    ready: false, readyAt: null, points: 0, lastStep: null, pivots: 0, events: 0, renders: 0,
    errors: [], connected: false, static: STATIC,
  });

  const S = {
    runs: [], shown: [], focus: null,
    xmode: "step", smooth: 0.9, log: false,
    view: null, // zoomed: {from, to, xmin, xmax}
    R: {}, // run index -> per-run state
    charts: {}, chartKeys: {},
    es: null, pts: {},
  };

  // ------------------------------------------------------------------ formatting

  const { fmtSI, fmtNum, fmtBytes, fmtDur, fmtTime, el, alpha } = window.DashFormat;
  const { renderStatus, renderTables } = window.DashTables({ S, runName, runColor }); // tables.js

  const X_LABEL = { step: "step", tokens: "tokens (cumulative)", time: "wall time (hours since the first entry)" };
  // whole-number tick steps for step and token axes: 1, 2, 5, 10, 20, 50, ...
  const INT_INCRS = [];
  for (let m = 1; m <= 1e15; m *= 10) INT_INCRS.push(m, 2 * m, 5 * m);
  function fmtX(v) {
    if (v == null) return "–";
    if (S.xmode === "time") return fmtNum(v, 4) + " h";
    return fmtSI(v, S.xmode === "step" ? 5 : 3);
  }

  async function getJSON(url) {
    const r = await fetch(url, { cache: "no-store" });
    if (!r.ok) throw new Error(url + ": HTTP " + r.status);
    return r.json();
  }

  function note(err) {
    dash.errors.push(String(err && err.message || err));
    console.warn(err);
  }

  // ------------------------------------------------------------------ data

  // A payload (overview, zoom or live push) as bucket columns.
  function cols(p) {
    const raw = p.raw;
    return {
      n: p.n, raw,
      step0: p.step, step1: raw ? p.step : p.step_end,
      tok0: p.tokens, tok1: raw ? p.tokens : p.tokens_end,
      time0: p.time, time1: raw ? p.time : p.time_end,
      rows: raw ? null : p.rows,
      v: columnsOf(p), wtps: p.wall_tok_s || [], mix: p.mix || {},
    };
  }

  // every value column as {min, max, mean} (a mean-only column: all three the same)
  function columnsOf(p) {
    const v = {};
    for (const c of COLUMNS) {
      const col = p[c.name] || [];
      v[c.name] = c.envelope ? { min: col.min || col.mean, max: col.max || col.mean, mean: col.mean }
        : { min: col, max: col, mean: col };
    }
    return v;
  }

  // one row's value of every column
  function valuesAt(p, i) {
    const v = {};
    for (const c of COLUMNS) v[c.name] = c.envelope ? p[c.name].mean[i] : p[c.name][i];
    return v;
  }

  // live rows from an `entries` push, appended to the run's tail (last entry wins)
  function addTail(r, p) {
    const base = lastStepOf(r.overview);
    for (let i = 0; i < p.n; i++) {
      const step = p.step[i];
      if (step <= base) continue; // already in the overview (a replay gives the same values)
      const mix = {};
      for (const a in p.mix) mix[a] = p.mix[a][i];
      const row = {
        step, tok: p.tokens[i], time: p.time[i], v: valuesAt(p, i), wtps: p.wall_tok_s ? p.wall_tok_s[i] : null, mix,
      };
      const t = r.tail;
      if (t.length && t[t.length - 1].step >= step) {
        const j = t.findIndex((x) => x.step >= step);
        if (t[j].step === step) t[j] = row; else t.splice(j, 0, row);
      } else t.push(row);
      if (dash.lastStep == null || step > dash.lastStep) dash.lastStep = step;
    }
  }

  function addEvals(r, e) {
    if (!e || !e.n) return;
    const ev = r.evals;
    for (let i = 0; i < e.n; i++) {
      const row = { step: e.step[i], loss: e.loss[i], arms: {} };
      for (const a in e.arms) if (e.arms[a][i] != null) row.arms[a] = e.arms[a][i];
      const j = ev.findIndex((x) => x.step >= row.step);
      if (j < 0) ev.push(row);
      else if (ev[j].step === row.step) ev[j] = row;
      else ev.splice(j, 0, row);
    }
  }

  function evalsFrom(p) {
    const out = [];
    for (let i = 0; i < p.n; i++) {
      const row = { step: p.step[i], loss: p.loss[i], arms: {} };
      for (const a in p.arms) if (p.arms[a][i] != null) row.arms[a] = p.arms[a][i];
      out.push(row);
    }
    return out;
  }

  function chartWidth() {
    const w = $("chart-loss").clientWidth || 1000;
    return Math.max(16, Math.min(4000, Math.round(w)));
  }

  async function fetchSeries(idx, view) {
    let url = `/api/runs/${idx}/series?width=${chartWidth()}`;
    if (view) url += `&from=${Math.max(0, Math.floor(view.from))}&to=${Math.max(0, Math.ceil(view.to))}`;
    return getJSON(url);
  }

  async function loadRun(idx) {
    const [ov, ev, st, ph, ex, ovr] = await Promise.all([
      fetchSeries(idx, null), getJSON(`/api/runs/${idx}/evals`),
      getJSON(`/api/runs/${idx}/state`), getJSON(`/api/runs/${idx}/phases`),
      getJSON(`/api/runs/${idx}/experiment`), // the first draw says when the first eval is due
      getJSON(`/api/runs/${idx}/overrides`),
    ]);
    const r = S.R[idx] || (S.R[idx] = { idx, tail: [], side: {}, evals: [] });
    r.overview = cols(ov);
    r.zoom = null;
    r.t0 = ov.t0;
    r.gen = ov.generation;
    r.offset = ov.offset;
    r.tail = [];
    r.evals = evalsFrom(ev);
    r.side.state = st.value;
    r.side.phases = ph.value;
    r.side.experiment = ex.value;
    r.side.overrides = ovr.value;
    await refreshMfu(r);
    if (STATIC) { // no stream will send the other sidecars: read them once
      const [sm, ck] = await Promise.all([getJSON(`/api/runs/${idx}/samples`),
        getJSON(`/api/runs/${idx}/checkpoints`)]);
      r.side.samples = sm.value;
      r.side.checkpoints = ck;
    }
    const ls = ov.last_step;
    if (ls != null && (dash.lastStep == null || ls > dash.lastStep)) dash.lastStep = ls;
    return r;
  }

  // what the run's MFU needs (/api/runs/N/mfu), refetched when its engine changes (a relaunch elsewhere)
  async function refreshMfu(r) {
    const st = r.side.state, eng = (st && st.engine) || {};
    const key = JSON.stringify([eng.kind, eng.device, eng.precision, eng.n_params, !!r.side.experiment]);
    if (r.mfuKey === key) return;
    r.mfuKey = key;
    try { r.mfu = await getJSON(`/api/runs/${r.idx}/mfu`); } catch (e) { note(e); }
  }

  // refetch a run's overview: its live tail grew long, it fell behind, or its log was replaced (hard)
  async function refreshOverview(r, hard) {
    if (hard) { r.tail = []; r.evals = []; }
    if (r.refreshing) { r.refreshAgain = r.refreshAgain === "hard" || hard ? "hard" : "soft"; return; }
    r.refreshing = true;
    try {
      const ov = await fetchSeries(r.idx, null);
      r.overview = cols(ov);
      r.t0 = ov.t0;
      const last = lastStepOf(r.overview);
      r.tail = r.tail.filter((t) => t.step > last);
      if (hard) {
        const ev = await getJSON(`/api/runs/${r.idx}/evals`);
        addEvals(r, { n: ev.n, step: ev.step, loss: ev.loss, arms: ev.arms });
      }
      if (ov.last_step != null) dash.lastStep = Math.max(dash.lastStep || 0, ov.last_step);
      scheduleRender();
    } catch (e) { note(e); } finally {
      r.refreshing = false;
      const again = r.refreshAgain;
      r.refreshAgain = null;
      if (again) refreshOverview(r, again === "hard");
    }
  }

  // ------------------------------------------------------------------ points

  // a run's points under the page's current settings (points.js)
  function runPoints(r) {
    return DashPoints.runPoints(r, { columns: COLUMNS, smooth: S.smooth, xmode: S.xmode, view: S.view });
  }
  const { lookup, lastStepOf } = DashPoints;

  // x of a step in the current x mode, from a run's points (for evals and pivot markers)
  function stepToX(P, step) {
    if (S.xmode === "step") return step;
    return P && P.step.length ? lookup(P.step, P.x, step, true) : null;
  }

  function xToStep(P, x) {
    if (S.xmode === "step") return x;
    return P && P.x.length ? lookup(P.x, P.step, x, false) : null;
  }

  // ------------------------------------------------------------------ charts

  function pivots() {
    const seen = new Map();
    for (const idx of S.shown) {
      const r = S.R[idx];
      const ph = r && r.side.phases;
      if (!Array.isArray(ph)) continue;
      for (const p of ph) {
        const s = p && p.start_step;
        if (typeof s === "number" && s > 0 && !seen.has(s)) {
          seen.set(s, { step: s, phase: p.phase, policy: p.policy, run: idx });
        }
      }
    }
    return [...seen.values()].sort((a, b) => a.step - b.step);
  }

  function pivotXs() {
    return pivots().map((p) => ({ ...p, x: stepToX(S.pts[p.run], p.step) })).filter((p) => p.x != null);
  }

  function drawPivots(u) {
    const ps = pivotXs();
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.strokeStyle = "#8e44ad";
    ctx.lineWidth = 1.5 * devicePixelRatio;
    ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]);
    for (const p of ps) {
      const cx = u.valToPos(p.x, "x", true);
      if (cx < left || cx > left + width) continue;
      ctx.beginPath();
      ctx.moveTo(cx, top);
      ctx.lineTo(cx, top + height);
      ctx.stroke();
    }
    ctx.restore();
    if (u.root.parentElement && u.root.parentElement.id === "chart-loss") {
      domPivots(u, ps);
      markReady(); // the loss chart has drawn its data: the page is ready
    }
  }

  // the loss chart also gets DOM markers: labelled, hoverable, and easy to test. A label that would overlap
  // the one before it on its row goes down a row, so two pivots close together stay readable.
  const LABEL_GAP_PX = 4;
  function domPivots(u, ps) {
    for (const m of u.over.querySelectorAll(".pivot-marker")) m.remove();
    const rowEnds = []; // per label row: the right edge of its last label
    let n = 0;
    for (const p of ps) {
      const x = u.valToPos(p.x, "x");
      if (!(x >= 0 && x <= u.over.clientWidth)) continue;
      const who = S.shown.length > 1 ? ` (${runName(p.run)})` : "";
      const label = el("span", null, `phase ${p.phase}${who}`);
      const m = el("div", { class: "pivot-marker", "data-step": p.step,
        title: `phase ${p.phase} from step ${p.step} (${p.policy || "?"})${who}` }, label);
      m.style.left = x + "px";
      u.over.append(m);
      const box = label.getBoundingClientRect();
      let row = rowEnds.findIndex((end) => end + LABEL_GAP_PX <= x);
      if (row < 0) { row = rowEnds.length; rowEnds.push(0); }
      rowEnds[row] = x + 3 + box.width;
      label.style.top = 2 + row * (Math.ceil(box.height) + 1) + "px";
      n++;
    }
    dash.pivots = n;
  }

  function onSelect(u) {
    const sel = u.select;
    if (sel.width < 4) return;
    const xmin = u.posToVal(sel.left, "x"), xmax = u.posToVal(sel.left + sel.width, "x");
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    zoomTo(xmin, xmax);
  }

  // a chart's options; every axis is labelled (the y axis with `yLabel`)
  function baseOpts(el_, height, series, extra, yLabel) {
    const width = Math.max(200, el_.clientWidth || 600);
    return Object.assign({
      width, height,
      scales: { x: { time: false } },
      axes: [
        Object.assign({ values: (u, sp) => sp.map(fmtX), grid: { stroke: "#eee" }, label: X_LABEL[S.xmode],
          labelSize: 18 }, S.xmode === "time" ? null : { incrs: INT_INCRS }),
        { values: (u, sp) => sp.map((v) => fmtNum(v, 3)), size: 64, grid: { stroke: "#eee" }, label: yLabel,
          labelSize: 18 },
      ],
      cursor: { drag: { x: true, y: false, setScale: false }, sync: { key: "dash" } },
      legend: { live: true },
      series: [{ label: X_LABEL[S.xmode], value: (u, v) => fmtX(v) }].concat(series),
      hooks: { setSelect: [onSelect], draw: [drawPivots] },
    }, extra || {});
  }

  function lineSeries(label, stroke, width, more) {
    return Object.assign({
      label, stroke, width, spanGaps: true, points: { show: false },
      value: (u, v) => fmtNum(v, 4),
    }, more || {});
  }

  // [x, ...ys] tables of several runs on one x axis (union of x; gaps spanned)
  function joinTables(tables) {
    const live = tables.filter((t) => t[0].length);
    if (!live.length) return [[]].concat(...tables.map((t) => t.slice(1).map(() => [])));
    if (tables.length === 1) return tables[0];
    return uPlot.join(tables);
  }

  function setChart(id, key, makeOpts, data) {
    const host = $(id);
    let u = S.charts[id];
    if (!u || S.chartKeys[id] !== key) {
      if (u) u.destroy();
      u = S.charts[id] = new uPlot(makeOpts(host), data, host);
      S.chartKeys[id] = key;
      host.ondblclick = () => resetZoom();
    } else {
      u.setData(data, !S.view);
    }
    if (S.view) u.setScale("x", { min: S.view.xmin, max: S.view.xmax });
    return u;
  }

  // a message over a chart that has nothing to draw yet (null: the chart has data)
  function emptyNote(id, message) {
    const host = $(id);
    let note = host.querySelector(":scope > .chart-empty");
    if (!message) {
      if (note) note.remove();
      return;
    }
    if (!note) {
      note = el("div", { class: "chart-empty" });
      host.append(note);
    }
    note.textContent = message;
  }

  // why the validation chart is empty: evaluations are off, or none is due yet
  function noEvalsYet(shown) {
    const every = shown.map((i) => {
      const exp = S.R[i] && S.R[i].side.experiment;
      const t = exp && typeof exp === "object" ? exp.train : null;
      return t && typeof t.eval_every === "number" ? t.eval_every : null;
    });
    if (every.length && every.every((e) => e === 0)) return "evaluations are off (train.eval_every is 0)";
    const n = every.find((e) => e > 0);
    return "no evaluation yet" + (n ? ` (one every ${n.toLocaleString()} steps)` : "");
  }

  function runName(idx) {
    const r = S.runs[idx];
    return r ? r.name : String(idx);
  }
  function runColor(idx) {
    return RUN_COLORS[S.shown.indexOf(idx) % RUN_COLORS.length];
  }

  // a run's evaluations as a table [x, all, ...arms] in x order (the arms' names pushed onto `arms`)
  function valTable(i, arms) {
    const r = S.R[i];
    for (const e of r.evals) for (const a in e.arms) if (!arms.includes(a)) arms.push(a);
    const xs = [], ys = [[]], seen = new Set();
    for (const a of arms) ys.push([]);
    for (const e of r.evals) {
      if (S.view && (e.step < S.view.from || e.step > S.view.to)) continue;
      const x = stepToX(S.pts[i], e.step);
      if (x == null || seen.has(x)) continue;
      seen.add(x);
      xs.push(x);
      ys[0].push(e.loss);
      arms.forEach((a, k) => ys[k + 1].push(e.arms[a] == null ? null : e.arms[a]));
    }
    const order = xs.map((_, k) => k).sort((a, b) => xs[a] - xs[b]);
    return [order.map((k) => xs[k])].concat(ys.map((y) => order.map((k) => y[k])));
  }

  function render() {
    dash.renders++;
    const shown = S.shown.filter((i) => S.R[i] && S.R[i].overview);
    S.pts = {};
    if (!shown.length) {
      for (const id of CHART_IDS()) emptyNote(id, S.runs.length ? "no run chosen" : "no run to show");
      renderTables();
      markReady();
      return;
    }
    for (const i of shown) S.pts[i] = runPoints(S.R[i]);
    const keyBase = [S.xmode, shown.join(",")].join("|");

    // training loss per run: the raw mean, its min..max band, the smoothed line and the validation loss
    const lossTables = [], lossSeries = [], lossBands = [];
    for (const i of shown) {
      const P = S.pts[i], c = runColor(i);
      lossTables.push([P.x, P.v.loss, P.vmin.loss, P.vmax.loss, P.lossS], valTable(i, []).slice(0, 2));
      const k = lossSeries.length + 1; // uPlot's series index of this run's raw line (0 is x)
      lossSeries.push(lineSeries(runName(i) + " raw", alpha(c, 0.45), 1, { _color: c }),
        lineSeries(runName(i) + " min", alpha(c, 0.2), 1, { _color: c }),
        lineSeries(runName(i) + " max", alpha(c, 0.2), 1, { _color: c }),
        lineSeries(runName(i) + " smoothed", c, 2, { _color: c }),
        lineSeries(runName(i) + " validation", c, 1.5, { _color: c, dash: [6, 3], points: { show: true, size: 5 } }));
      lossBands.push({ series: [k + 2, k + 1], fill: alpha(c, 0.12) });
    }
    const lossData = joinTables(lossTables.length ? lossTables : [[[], [], [], [], []]]);
    setChart("chart-loss", keyBase + "|" + S.log, (h) => baseOpts(h, 300, lossSeries,
      Object.assign({ bands: lossBands }, S.log ? { scales: { x: { time: false }, y: { distr: 3, log: 10 } } } : null),
      "loss (nats/token)"), lossData);
    dash.points = shown.reduce((a, i) => a + S.pts[i].x.length, 0);
    const noSteps = dash.points ? null : NO_STEPS;
    for (const id of STEP_CHARTS()) emptyNote(id, noSteps);

    // validation loss per arm, coloured by run (arms by dash pattern); x from the run's own step->x mapping
    const valTables = [], valSeries = [];
    for (const i of shown) {
      const arms = [];
      valTables.push(valTable(i, arms));
      valSeries.push(lineSeries(runName(i) + " all", runColor(i), 2, { _color: runColor(i), points: { show: true, size: 4 } }));
      arms.forEach((a, k) => valSeries.push(lineSeries(runName(i) + "/" + a, runColor(i), 1.25,
        { _color: runColor(i), dash: ARM_DASHES[k % ARM_DASHES.length], points: { show: true, size: 3 } })));
    }
    setChart("chart-val", keyBase + "|" + valSeries.map((s) => s.label).join(","),
      (h) => baseOpts(h, 230, valSeries, null, "loss (nats/token)"),
      joinTables(valTables.length ? valTables : [[[]]]));
    emptyNote("chart-val", shown.some((i) => S.R[i].evals.length) ? null : noEvalsYet(shown));

    // the columns with a chart of their own (learning rate, gradient norm, ...): the mean, and for an
    // envelope column its min..max band; then tokens/s
    const simple = (id, col, height, fmt) => {
      const tables = [], series = [], bands = [];
      for (const i of shown) {
        const P = S.pts[i], c = runColor(i);
        if (col.envelope) {
          const k = series.length + 1;
          tables.push([P.x, P.v[col.name], P.vmin[col.name], P.vmax[col.name]]);
          series.push(lineSeries(runName(i), c, 1.25, { _color: c, value: (u, v) => fmt(v) }),
            lineSeries(runName(i) + " min", alpha(c, 0.2), 1, { _color: c, value: (u, v) => fmt(v) }),
            lineSeries(runName(i) + " max", alpha(c, 0.2), 1, { _color: c, value: (u, v) => fmt(v) }));
          bands.push({ series: [k + 2, k + 1], fill: alpha(c, 0.12) });
        } else {
          tables.push([P.x, P.v[col.name]]);
          series.push(lineSeries(runName(i), c, 1.25, { _color: c, value: (u, v) => fmt(v) }));
        }
      }
      setChart(id, keyBase, (h) => {
        const o = baseOpts(h, height, series, { bands }, col.label);
        o.axes[1].values = (u, sp) => sp.map(fmt);
        return o;
      }, joinTables(tables.length ? tables : [[[], []]]));
    };
    for (const c of OWN_CHARTS()) simple(c.chart, c, 180, (v) => fmtNum(v, 3));
    // tokens/s: the engine's step compute (solid) and the wall clock's, audits and waits included (dashed)
    const tpsTables = shown.map((i) => [S.pts[i].x, S.pts[i].v.tok_s, S.pts[i].wtps]);
    setChart("chart-tps", keyBase, (h) => {
      const fmt = (v) => fmtSI(v, 3);
      const o = baseOpts(h, 180, shown.flatMap((i) => [
        lineSeries(runName(i) + " engine", runColor(i), 1.25, { _color: runColor(i), value: (u, v) => fmt(v) }),
        lineSeries(runName(i) + " wall clock", runColor(i), 1.25,
          { _color: runColor(i), dash: [5, 3], value: (u, v) => fmt(v) }),
      ]), null, "tokens / s");
      o.axes[1].values = (u, sp) => sp.map(fmt);
      return o;
    }, joinTables(tpsTables.length ? tpsTables : [[[], [], []]]));

    // MFU of each CUDA run: the engine's tokens/s times the FLOPs a token costs, over the GPU's peak
    const mfuOf = (i) => { const m = S.R[i].mfu; return m && m.flops_per_token ? m : null; };
    setChart("chart-mfu", keyBase, (h) => {
      const o = baseOpts(h, 180, shown.map((i) => lineSeries(runName(i), runColor(i), 1.25,
        { _color: runColor(i), value: (u, v) => (v == null ? "–" : v.toFixed(2) + "%") })), null, "MFU (%)");
      o.axes[1].values = (u, sp) => sp.map((v) => v + "%");
      return o;
    }, joinTables(shown.map((i) => {
      const m = mfuOf(i), P = S.pts[i];
      return [P.x, P.v.tok_s.map((t) => (m && t != null ? (100 * t * m.flops_per_token) / m.peak_flops : null))];
    })));
    const noMfu = shown.filter((i) => !mfuOf(i));
    emptyNote("chart-mfu", noMfu.length < shown.length ? null
      : noMfu.map((i) => runName(i) + ": " + ((S.R[i].mfu && S.R[i].mfu.why) || "MFU unknown")).join("; "));

    // mixture weights of the focus run, stacked
    const f = S.pts[S.focus] ? S.focus : shown[0];
    const P = S.pts[f];
    const arms = P ? P.arms : [];
    const cum = [];
    if (P) {
      let acc = P.x.map(() => 0);
      for (const a of arms) {
        acc = acc.map((s, k) => s + (P.mix[a][k] || 0));
        cum.push(acc);
      }
    }
    const order = arms.map((_, k) => arms.length - 1 - k); // draw the tallest first
    const mixData = [P ? P.x : []].concat(order.map((k) => cum[k]));
    $("mix-note").textContent = f != null ? "(" + runName(f) + ")" : "";
    setChart("chart-mix", keyBase + "|" + f + "|" + arms.join(","), (h) => baseOpts(h, 230,
      order.map((k) => lineSeries(arms[k], ARM_COLORS[k % ARM_COLORS.length], 1, {
        fill: alpha(ARM_COLORS[k % ARM_COLORS.length], 0.55), fillTo: 0,
        value: (u, v, si, idx) => (idx == null || !P ? "–" : fmtNum(P.mix[arms[k]][idx], 3)),
      })), { scales: { x: { time: false }, y: { range: [0, 1] } } }, "weight (stacked)"), mixData);
    emptyNote("chart-mix", P && arms.length && P.x.length ? null : "no mixture logged yet");

    // every chart spans the same x range as the loss chart (cursor sync lines up)
    if (!S.view && lossData[0].length) {
      const xr = { min: lossData[0][0], max: lossData[0][lossData[0].length - 1] };
      for (const id in S.charts) if (id !== "chart-loss" && xr.max > xr.min) S.charts[id].setScale("x", xr);
    }
    renderTables();
  }

  // the "ready" marker: set once, when the loss chart first drew (or there is nothing to draw)
  function markReady() {
    if (dash.ready) return;
    dash.ready = true;
    dash.readyAt = performance.now();
    document.documentElement.dataset.ready = "1";
  }

  let renderTimer = null, lastRender = 0;
  function scheduleRender() {
    if (renderTimer) return;
    const wait = Math.max(0, 200 - (performance.now() - lastRender));
    renderTimer = setTimeout(() => {
      renderTimer = null;
      requestAnimationFrame(() => {
        lastRender = performance.now();
        try { render(); } catch (e) { note(e); }
      });
    }, wait);
  }

  // ------------------------------------------------------------------ zoom

  function zoomTo(xmin, xmax) {
    let from = Infinity, to = -Infinity;
    for (const i of S.shown) {
      const P = S.pts[i];
      if (!P) continue;
      const a = xToStep(P, xmin), b = xToStep(P, xmax);
      if (a != null) from = Math.min(from, a);
      if (b != null) to = Math.max(to, b);
    }
    if (!(to >= from)) return;
    S.view = { from: Math.floor(from), to: Math.ceil(to), xmin, xmax };
    for (const id in S.charts) S.charts[id].setScale("x", { min: xmin, max: xmax });
    const view = S.view;
    Promise.all(S.shown.map(async (i) => {
      const p = await fetchSeries(i, view);
      if (S.view === view && S.R[i]) S.R[i].zoom = cols(p);
    })).then(() => scheduleRender(), note);
  }

  function resetZoom() {
    if (!S.view) return;
    S.view = null;
    for (const i of S.shown) if (S.R[i]) S.R[i].zoom = null;
    for (const id in S.charts) S.chartKeys[id] = null; // rebuild: auto-range x again
    render();
  }

  // ------------------------------------------------------------------ live

  function connect() {
    if (S.es) S.es.close();
    const shown = S.shown.filter((i) => S.R[i]);
    if (!shown.length) return;
    const at = shown.map((i) => `${S.R[i].gen}.${S.R[i].offset}`).join(",");
    const es = (S.es = new EventSource(`/api/stream?runs=${shown.join(",")}&at=${at}`));
    const conn = $("conn");
    es.onopen = () => { conn.textContent = "live"; conn.className = "conn live"; dash.connected = true; };
    es.onerror = () => { conn.textContent = "reconnecting…"; conn.className = "conn off"; dash.connected = false; };
    es.addEventListener("entries", (ev) => {
      dash.events++;
      const d = JSON.parse(ev.data);
      const r = S.R[d.run];
      if (!r) return;
      if (d.generation !== r.gen) refreshOverview(r, true);
      r.gen = d.generation;
      r.offset = d.offset;
      addTail(r, d.steps);
      addEvals(r, d.evals);
      if (r.tail.length > 2 * chartWidth()) refreshOverview(r, false);
      scheduleRender();
    });
    es.addEventListener("sidecar", (ev) => {
      const d = JSON.parse(ev.data);
      const r = S.R[d.run];
      if (!r) return;
      r.side[d.kind] = d.value;
      if (d.kind === "state" || d.kind === "experiment") refreshMfu(r).then(scheduleRender);
      scheduleRender();
    });
    es.addEventListener("reset", (ev) => {
      const d = JSON.parse(ev.data);
      const r = S.R[d.run];
      if (!r) return;
      const hard = d.generation !== r.gen;
      r.gen = d.generation;
      r.offset = d.offset;
      refreshOverview(r, hard);
    });
  }

  // ------------------------------------------------------------------ setup

  function readControls() {
    S.xmode = $("xmode").value;
    S.smooth = +$("smooth").value;
    S.log = $("logscale").checked;
    $("smooth-val").textContent = S.smooth.toFixed(3);
  }

  function buildPicker() {
    const box = $("run-picker");
    box.replaceChildren();
    S.runs.forEach((r, i) => {
      const cb = el("input", { type: "checkbox", value: i });
      cb.checked = S.shown.includes(i);
      cb.addEventListener("change", () => setShown(S.runs.map((_, k) => k).filter((k) =>
        box.querySelector(`input[value="${k}"]`).checked)));
      const sw = el("span", { class: "swatch" });
      sw.style.background = S.shown.includes(i) ? runColor(i) : "#777";
      box.append(el("label", { title: r.experiment || r.name }, cb, sw, r.name));
    });
    const fs = $("focus");
    fs.replaceChildren();
    for (const i of S.shown) {
      const o = el("option", { value: i }, runName(i));
      if (i === S.focus) o.selected = true;
      fs.append(o);
    }
  }

  async function setShown(list) {
    S.shown = list.slice(0, MAX_SHOWN);
    if (!S.shown.includes(S.focus)) S.focus = S.shown[0];
    const q = new URLSearchParams(location.search);
    q.set("runs", S.shown.join(","));
    history.replaceState(null, "", "?" + q.toString());
    buildPicker();
    await Promise.all(S.shown.filter((i) => !S.R[i]).map(loadRun));
    S.view = null;
    render();
    if (STATIC) {
      const conn = $("conn");
      conn.textContent = "static snapshot (no live updates)";
      conn.className = "conn";
    } else connect();
  }

  // a panel for each column with a chart of its own, in column order, before the tokens/s panel
  function addColumnCharts() {
    const before = $("chart-tps").parentNode;
    for (const c of OWN_CHARTS()) {
      if ($(c.chart)) continue;
      const title = c.label.charAt(0).toUpperCase() + c.label.slice(1);
      before.parentNode.insertBefore(el("div", { class: "panel third" }, el("h2", null, title),
        el("div", { id: c.chart, class: "chart" })), before);
    }
  }

  async function start() {
    readControls();
    for (const id of ["xmode", "smooth", "logscale"]) {
      $(id).addEventListener(id === "smooth" ? "input" : "change", () => {
        const xChanged = S.xmode !== $("xmode").value;
        readControls();
        if (xChanged) { S.view = null; for (const i of S.shown) if (S.R[i]) S.R[i].zoom = null; }
        scheduleRender();
      });
    }
    $("reset-zoom").addEventListener("click", resetZoom);
    $("focus").addEventListener("change", () => { S.focus = +$("focus").value; scheduleRender(); });
    let rt = null;
    window.addEventListener("resize", () => {
      clearTimeout(rt);
      rt = setTimeout(() => {
        for (const id in S.charts) {
          const h = $(id);
          S.charts[id].setSize({ width: Math.max(200, h.clientWidth), height: S.charts[id].height });
        }
      }, 150);
    });
    if (!STATIC) setInterval(renderStatus, 5000); // ages ("updated 5s ago") keep moving

    COLUMNS = await getJSON("/api/columns");
    addColumnCharts();
    for (const id of CHART_IDS()) DashPanels.addDownloads($(id).parentNode, id, () => S.charts[id] || null);
    for (const id of DashSystem.ids) DashPanels.addDownloads($(id).parentNode, id, () => DashSystem.chart(id));
    DashSystem.start(STATIC, fmtBytes, note);
    S.runs = await getJSON("/api/runs");
    const q = new URLSearchParams(location.search).get("runs");
    let shown = q ? q.split(",").map(Number).filter((i) => Number.isInteger(i) && i >= 0 && i < S.runs.length)
      : S.runs.map((_, i) => i);
    if (!shown.length) shown = S.runs.length ? [0] : [];
    S.focus = shown[0];
    await setShown(shown);
  }

  // for tests and the curious: the current zoom
  // what one chart draws: its series' labels and its data columns (x first)
  // and its axes' labels and the message it shows while it has nothing to draw (null when it has)
  window.__dashboardChart = (id) => {
    const u = S.charts[id];
    const note = $(id).querySelector(":scope > .chart-empty");
    const empty = note ? note.textContent : null;
    if (!u) return note ? { labels: [], data: [], axes: [], empty } : null;
    return { labels: u.series.map((s) => s.label), colors: u.series.map((s) => s._color || null),
      data: u.data.map((col) => Array.from(col)),
      axes: u.axes.map((a) => a.label || null), empty };
  };
  window.__dashboardZoom = () => ({
    zoomed: !!S.view, from: S.view ? S.view.from : null, to: S.view ? S.view.to : null,
    raw: !!S.view && S.shown.every((i) => S.R[i] && S.R[i].zoom && S.R[i].zoom.raw),
  });

  start().catch((e) => {
    note(e);
    $("conn").textContent = "error: " + e.message;
  });
})();
