/* microgpt dashboard: a run's chart points from its series buckets and live tail (app.js draws them).
 *
 * `opt`: {columns (/api/columns), smooth (the EMA factor), xmode ("step" | "tokens" | "time"), view (the
 * zoom: {from, to} steps, or null)}.
 */
"use strict";
window.DashPoints = (function () {
  function lastStepOf(c) {
    return c && c.n ? c.step1[c.n - 1] : -1;
  }

  // Every bucket becomes one point, at the middle of its steps (tokens, time): the mean of each column, with
  // its min and max beside it (v, vmin, vmax). The charts draw the mean as a line and min..max as a band, so
  // a one-step spike stays visible at every zoom level, and nothing alternates between min and max (which
  // drew a zigzag) or repeats a value at both ends of a bucket (a staircase).
  function runPoints(r, opt) {
    const base = r.zoom || r.overview;
    const xs = [], steps = [], lossS = [], wtps = [], v = {}, vmin = {}, vmax = {};
    for (const c of opt.columns) { v[c.name] = []; vmin[c.name] = []; vmax[c.name] = []; }
    const arms = Object.keys(base ? base.mix : {});
    for (const t of r.tail) for (const a in t.mix) if (!arms.includes(a)) arms.push(a);
    const mix = {};
    for (const a of arms) mix[a] = [];
    const beta = opt.smooth;
    let ema = 0, norm = 0;
    const t0 = r.t0 || 0;
    const mid = (a, b) => (a == null || b == null ? null : (a + b) / 2);
    const xOf = (step, tok, time) =>
      opt.xmode === "step" ? step : opt.xmode === "tokens" ? tok : time == null ? null : (time - t0) / 3600;
    const smooth = (v, n) => {
      if (v == null) return norm > 0 ? ema / norm : null;
      const b = Math.pow(beta, n);
      ema = b * ema + (1 - b) * v;
      norm = b * norm + (1 - b);
      return ema / norm;
    };
    // val(name, "min" | "max" | "mean"): the point's value of that column
    const push = (x, step, val, s, wtp, mixv) => {
      if (x == null) return;
      xs.push(x); steps.push(step); lossS.push(s);
      for (const c of opt.columns) {
        v[c.name].push(val(c.name, "mean"));
        vmin[c.name].push(val(c.name, "min"));
        vmax[c.name].push(val(c.name, "max"));
      }
      wtps.push(wtp == null ? null : wtp);
      for (const a of arms) mix[a].push(mixv(a));
    };
    if (base) {
      for (let i = 0; i < base.n; i++) {
        const n = base.rows ? base.rows[i] : 1;
        const s = smooth(base.v.loss.mean[i], n);
        const mv = (a) => (base.mix[a] ? base.mix[a][i] : null);
        push(xOf(mid(base.step0[i], base.step1[i]), mid(base.tok0[i], base.tok1[i]), mid(base.time0[i], base.time1[i])),
          mid(base.step0[i], base.step1[i]), (c, k) => base.v[c][k][i], s, base.wtps[i], mv);
      }
    }
    const last = lastStepOf(base);
    for (const t of r.tail) {
      if (t.step <= last || (opt.view && t.step > opt.view.to)) continue;
      push(xOf(t.step, t.tok, t.time), t.step, (c) => t.v[c], smooth(t.v.loss, 1), t.wtps,
        (a) => (t.mix[a] == null ? null : t.mix[a]));
    }
    // x must increase for the chart: drop anything out of order (clock steps back, replays)
    let ok = true;
    for (let i = 1; i < xs.length; i++) if (!(xs[i] > xs[i - 1])) { ok = false; break; }
    const P = { x: xs, step: steps, v, vmin, vmax, lossS, wtps, mix, arms };
    return ok ? P : monotone(P);
  }

  function monotone(P) {
    const keep = [];
    let last = -Infinity;
    for (let i = 0; i < P.x.length; i++) if (P.x[i] > last) { keep.push(i); last = P.x[i]; }
    const pick = (a) => keep.map((i) => a[i]);
    const pickAll = (o) => { const out = {}; for (const k in o) out[k] = pick(o[k]); return out; };
    return { x: pick(P.x), step: pick(P.step), v: pickAll(P.v), vmin: pickAll(P.vmin), vmax: pickAll(P.vmax),
      lossS: pick(P.lossS), wtps: pick(P.wtps), mix: pickAll(P.mix), arms: P.arms };
  }

  // the value in `to` where `from` (ascending) reaches v, clamped at the ends; between two
  // points: interpolated, or the lower point's
  function lookup(from, to, v, interpolate) {
    const last = from.length - 1;
    if (v <= from[0]) return to[0];
    if (v >= from[last]) return to[last];
    let lo = 0, hi = last;
    while (hi - lo > 1) { const m = (lo + hi) >> 1; if (from[m] <= v) lo = m; else hi = m; }
    if (!interpolate) return to[lo];
    const f = (v - from[lo]) / (from[hi] - from[lo] || 1);
    return to[lo] + f * (to[hi] - to[lo]);
  }

  return { runPoints, lookup, lastStepOf };
})();
