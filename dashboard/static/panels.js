/* microgpt dashboard: the configuration panel and every chart's CSV and PNG download.
 *
 * app.js calls DashPanels.config(...) when the focus run's sidecars change and DashPanels.addDownloads(...)
 * once per chart panel. Everything from run files goes into the page as text.
 */
"use strict";
window.DashPanels = (function () {
  const MAX_CONFIG_ROWS = 2000; // an experiment is far smaller; a bigger one is cut, and says so

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) e.setAttribute(k, attrs[k]);
    for (const c of kids) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  // ------------------------------------------------------------------ configuration

  // [dotted key, value] of every leaf of `obj`, keys as `--set` names them (a list index is a part: arms.0.cap)
  function flatten(obj, prefix, out) {
    if (out.length > MAX_CONFIG_ROWS) return out;
    const isList = Array.isArray(obj);
    if (obj !== null && typeof obj === "object" && (isList ? obj.length : Object.keys(obj).length)) {
      for (const [k, v] of isList ? obj.map((v, i) => [String(i), v]) : Object.entries(obj)) {
        flatten(v, prefix ? prefix + "." + k : k, out);
      }
    } else out.push([prefix, JSON.stringify(obj)]);
    return out;
  }

  // the key an override sets ("train.lr=0.002" -> "train.lr")
  const overrideKey = (text) => String(text).split("=")[0];

  function engineRows(eng) {
    const build = [eng.kind, eng.version ? "version " + eng.version : null, eng.precision, eng.threads ?
      eng.threads + " threads" : null, eng.ranks > 1 ? eng.ranks + " ranks" : null].filter(Boolean).join(" · ");
    return [
      ["engine build", build || "–"],
      ["source commit", eng.source || "–"],
      ["device", eng.device || "–"],
      ["binary", eng.path || "–"],
    ];
  }

  /* The focus run's configuration: engine build, version and commit (.state.json, from the engine's ready
   * event), the `--set` overrides of its last launch (.overrides.json) and the effective experiment
   * (experiment.json, what the run froze), one row per setting, the overridden ones marked. */
  function config(box, name, side) {
    const exp = side.experiment, overrides = Array.isArray(side.overrides) ? side.overrides : [];
    const eng = (side.state && side.state.engine) || {};
    const key = JSON.stringify([name, exp, overrides, engineRows(eng)]);
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    box.replaceChildren();
    const dl = el("dl", { class: "config-engine" });
    for (const [k, v] of engineRows(eng)) dl.append(el("dt", null, k), el("dd", null, v));
    dl.append(el("dt", null, "overrides"), el("dd", { class: "config-overrides" },
      overrides.length ? overrides.join("  ") : "none (the experiment file as written)"));
    box.append(dl);
    if (!exp || typeof exp !== "object") {
      box.append(el("p", { class: "empty" }, "no experiment.json yet"));
      return;
    }
    const set = new Set(overrides.map(overrideKey));
    const rows = flatten(exp, "", []);
    const tb = el("tbody");
    for (const [k, v] of rows.slice(0, MAX_CONFIG_ROWS)) {
      const tr = el("tr", set.has(k) ? { class: "override", title: "set on the command line (--set)" } : null,
        el("td", null, k), el("td", null, v));
      tb.append(tr);
    }
    const table = el("table", { id: "config-table" }, el("thead", null, el("tr", null, el("th", null, "setting"),
      el("th", null, "value"))), tb);
    box.append(table);
    if (rows.length > MAX_CONFIG_ROWS) box.append(el("p", { class: "empty" }, `first ${MAX_CONFIG_ROWS} settings shown`));
  }

  // ------------------------------------------------------------------ downloads

  function save(blob, filename) {
    const a = el("a", { href: URL.createObjectURL(blob), download: filename });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  const csvCell = (v) => {
    if (v == null) return "";
    const s = String(v);
    return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  };

  // a chart's data as CSV: a header of its series' labels (x first), a row per x value
  function chartCSV(u) {
    const lines = [u.series.map((s) => csvCell(s.label)).join(",")];
    const n = u.data[0] ? u.data[0].length : 0;
    for (let i = 0; i < n; i++) lines.push(u.data.map((col) => csvCell(col[i])).join(","));
    return lines.join("\n") + "\n";
  }

  // a chart as PNG: its canvas (lines and axes) on white, its title above and its series named below
  function chartPNG(u, title) {
    const src = u.ctx.canvas, ratio = src.width / (u.width || src.width);
    const head = Math.round(24 * ratio), foot = Math.round(18 * ratio) * Math.ceil((u.series.length - 1) / 4);
    const c = document.createElement("canvas");
    c.width = src.width;
    c.height = src.height + head + foot;
    const ctx = c.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, c.width, c.height);
    ctx.fillStyle = "#1d2330";
    ctx.font = `600 ${Math.round(14 * ratio)}px system-ui, sans-serif`;
    ctx.fillText(title, 8 * ratio, 17 * ratio);
    ctx.drawImage(src, 0, head);
    ctx.font = `${Math.round(12 * ratio)}px system-ui, sans-serif`;
    u.series.slice(1).forEach((s, k) => {
      const x = 8 * ratio + (k % 4) * (c.width / 4), y = src.height + head + (Math.floor(k / 4) + 0.8) * 18 * ratio;
      ctx.fillStyle = s._color || "#1d2330";
      ctx.fillRect(x, y - 9 * ratio, 10 * ratio, 10 * ratio);
      ctx.fillStyle = "#1d2330";
      ctx.fillText(s.label, x + 14 * ratio, y);
    });
    // synchronously, inside the click: a download started later (toBlob's callback) may have lost the
    // click's user activation, and the browser then blocks it as an automatic download
    const bytes = atob(c.toDataURL("image/png").split(",")[1]);
    const out = new Uint8Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) out[i] = bytes.charCodeAt(i);
    return new Blob([out], { type: "image/png" });
  }

  /* CSV and PNG buttons in a chart panel's title; chartOf() gives the chart's uPlot (null before it drew) */
  function addDownloads(panel, id, chartOf) {
    const h2 = panel.querySelector("h2");
    if (!h2 || h2.querySelector(".downloads")) return;
    const title = h2.firstChild ? h2.firstChild.textContent.trim() : id;
    const file = id.replace(/^chart-/, "");
    const button = (label, what, act) => {
      const b = el("button", { type: "button", class: "dl", "data-download": what, title: `download this chart as ${label}` }, label);
      b.addEventListener("click", () => { const u = chartOf(); if (u) act(u); });
      return b;
    };
    h2.append(el("span", { class: "downloads" },
      button("CSV", "csv", (u) => save(new Blob([chartCSV(u)], { type: "text/csv" }), file + ".csv")),
      button("PNG", "png", (u) => save(chartPNG(u, title), file + ".png"))));
  }

  return { config, addDownloads, chartCSV };
})();
