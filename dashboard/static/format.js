/* microgpt dashboard: number, size, duration and time formats, and the element builder every script uses. */
"use strict";
window.DashFormat = (function () {
  function fmtSI(v, digits) {
    if (v == null || !isFinite(v)) return "–";
    const a = Math.abs(v);
    const d = digits == null ? 3 : digits;
    if (a >= 1e12) return +(v / 1e12).toPrecision(d) + "T";
    if (a >= 1e9) return +(v / 1e9).toPrecision(d) + "G";
    if (a >= 1e6) return +(v / 1e6).toPrecision(d) + "M";
    if (a >= 1e4) return +(v / 1e3).toPrecision(d) + "k";
    if (a >= 100 || a === 0) return String(Math.round(v));
    return String(+v.toPrecision(d));
  }
  function fmtNum(v, d) {
    if (v == null || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(d == null ? 2 : d - 1).replace(/\.?0+e/, "e");
    return String(+v.toPrecision(d == null ? 4 : d));
  }
  function fmtBytes(b) {
    if (b == null || !isFinite(b)) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(1) : b) + " " + u[i];
  }
  function fmtDur(s) {
    if (s == null || !isFinite(s) || s < 0) return "–";
    s = Math.round(s);
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + (s % 60) + "s";
    return s + "s";
  }
  // ISO 8601 in the browser's time zone, with its offset: 2026-11-28T04:51:07+00:00
  function fmtTime(t) {
    if (t == null || !isFinite(t)) return "–";
    const d = new Date(t * 1000);
    const p2 = (v) => String(v).padStart(2, "0");
    const off = -d.getTimezoneOffset();
    const zone = (off >= 0 ? "+" : "-") + p2(Math.floor(Math.abs(off) / 60)) + ":" + p2(Math.abs(off) % 60);
    return `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())}T${p2(d.getHours())}:${p2(d.getMinutes())}` +
      `:${p2(d.getSeconds())}${zone}`;
  }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) {
      if (k === "class") e.className = attrs[k];
      else if (k === "style") e.setAttribute("style", attrs[k]);
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of kids) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
  }

  return { fmtSI, fmtNum, fmtBytes, fmtDur, fmtTime, el, alpha };
})();
