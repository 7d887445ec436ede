/* microgpt dashboard: the status cards of the runs shown, and the focus run's phases, checkpoints,
 * configuration and sample audits. app.js calls renderTables() after each draw and renderStatus() every 5 s;
 * `page` is its state (S) and how it names and colours a run. Run files go into the page as text only.
 */
"use strict";
window.DashTables = function (page) {
  const { fmtSI, fmtNum, fmtBytes, fmtDur, fmtTime, el } = window.DashFormat;
  const { lastStepOf } = window.DashPoints;
  const { S, runName, runColor } = page;
  const $ = (id) => document.getElementById(id);

  function statusOf(st) {
    if (!st) return ["unknown", "no .state.json yet"];
    const age = Date.now() / 1000 - (st.updated || 0);
    const eng = st.engine || {};
    if (st.status === "running") {
      if (eng.alive && age < 120) return ["alive", "engine running"];
      return ["stale", `no update for ${fmtDur(age)}`];
    }
    return [st.status || "unknown", st.message || ""];
  }

  function renderStatus() {
    const box = $("status");
    box.replaceChildren();
    for (const idx of S.shown) {
      const r = S.R[idx];
      if (!r) continue;
      const st = r.side.state;
      const info = S.runs[idx] || {};
      const [label, why] = statusOf(st);
      const eng = (st && st.engine) || {};
      // the newest of the two sources: .state.json (rewritten every few seconds) and the log itself
      const logged = loggedStep(r);
      const fromState = st && typeof st.step === "number" ? st.step : -1;
      const step = Math.max(logged, fromState) >= 0 ? Math.max(logged, fromState) : null;
      const maxSteps = (st && st.max_steps) || info.max_steps;
      const rows = [
        ["step", (step == null ? "–" : step.toLocaleString()) + (maxSteps ? " / " + maxSteps.toLocaleString() : "")],
        ["last logged", lastLogged(r)],
        ["ETA", st ? fmtDur(st.eta_s) : "–"],
        ["phase", st ? `${st.phase} (${st.policy || "?"})` : "–"],
        ["engine", [eng.kind, eng.device].filter(Boolean).join(" · ") || "–"],
        ["memory", `engine ${fmtBytes(eng.mem_bytes)} · rss ${fmtBytes(eng.rss_bytes)}`],
        ["tokens/s", st ? `${fmtSI(st.tokens_per_s)} wall clock · ${fmtSI(st.engine_tokens_per_s)} engine` : "–"],
        ["overhead", overheadOf(st)],
        ["checkpoint", st && st.last_checkpoint ? String(st.last_checkpoint).split("/").pop() : "–"],
        ["updated", st && st.updated ? fmtDur(Date.now() / 1000 - st.updated) + " ago" : "–"],
      ];
      const dl = el("dl");
      for (const [k, v] of rows) dl.append(el("dt", null, k), el("dd", null, v));
      box.append(el("div", { class: "card", style: `--c:${runColor(idx)}`, "data-run": idx },
        el("h3", null, info.name || String(idx), el("span", { class: "pill " + label, title: why }, label)), dl));
    }
  }

  // the share of wall time that did not go to steps, and its split (.state.json's goodput)
  function overheadOf(st) {
    const g = st && st.goodput;
    if (!g || typeof g.overhead !== "number" || !(g.wall_s > 0)) return "–";
    const pct = (v) => (typeof v === "number" ? (100 * v).toFixed(1) + "%" : "–");
    const parts = Object.entries(g.audits || {}).map(([k, a]) => `${k} ${pct(a && a.s / g.wall_s)}`);
    parts.push(`other ${pct(g.other_s / g.wall_s)}`);
    return `${pct(g.overhead)} (${parts.join(", ")})`;
  }

  // the run's last logged step (-1: none yet)
  function loggedStep(r) {
    return r.tail.length ? r.tail[r.tail.length - 1].step : lastStepOf(r.overview);
  }

  function lastLogged(r) {
    const t = r.tail.length ? r.tail[r.tail.length - 1] : null;
    const base = r.overview;
    const step = t ? t.step : lastStepOf(base);
    const loss = t ? t.v.loss : base && base.n ? base.v.loss.mean[base.n - 1] : null;
    return step < 0 ? "–" : `step ${step.toLocaleString()} · loss ${fmtNum(loss, 4)}`;
  }

  function renderTables() {
    renderStatus();
    const r = S.R[S.focus];
    const side = (r && r.side) || {};
    const ph = $("phases").tBodies[0];
    ph.replaceChildren();
    if (Array.isArray(side.phases) && side.phases.length) {
      for (const p of side.phases) {
        const bounds = (o, sign) => (o && typeof o === "object"
          ? Object.entries(o).map(([a, c]) => `${a} ${sign} ${c}`).join(", ") : "");
        ph.append(el("tr", { "data-step": p.start_step }, el("td", null, p.phase), el("td", null, p.start_step),
          el("td", null, p.policy || ""), el("td", null, bounds(p.floors, "≥")), el("td", null, bounds(p.caps, "≤"))));
      }
    } else ph.append(el("tr", null, el("td", { class: "empty", colspan: 5 }, "no phases.json yet")));

    const ck = $("checkpoints").tBodies[0];
    ck.replaceChildren();
    const list = Array.isArray(side.checkpoints) ? side.checkpoints : [];
    for (const c of list.slice(0, 500)) {
      ck.append(el("tr", null, el("td", null, c.name), el("td", null, c.step == null ? "" : c.step),
        el("td", null, fmtBytes(c.bytes)), el("td", null, fmtTime(c.mtime))));
    }
    if (!list.length) ck.append(el("tr", null, el("td", { class: "empty", colspan: 4 }, "no checkpoints yet")));

    $("config-note").textContent = r ? "(" + runName(S.focus) + ")" : "";
    DashPanels.config($("config"), r ? runName(S.focus) : "", side);

    const sm = $("samples");
    const audits = Array.isArray(side.samples) ? side.samples.slice().reverse() : [];
    const key = JSON.stringify(audits.map((a) => [a.step, a.time]));
    if (sm.dataset.key !== key) {
      sm.dataset.key = key;
      sm.replaceChildren();
      for (const a of audits) {
        const box = el("div", { class: "audit", "data-step": a.step },
          el("h4", null, `step ${a.step == null ? "?" : a.step.toLocaleString()}` + (a.time ? " · " + fmtTime(a.time) : "")));
        for (const s of a.samples || []) {
          box.append(el("div", { class: "sample" }, el("span", { class: "prompt" }, s.prompt), s.completion));
        }
        sm.append(box);
      }
      if (!audits.length) sm.append(el("p", { class: "empty" }, "no sample audits yet"));
    }
  }

  return { renderStatus, renderTables };
};
