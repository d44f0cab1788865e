// Units for everything the page writes: bytes in binary units, as `npumem report` writes them
// (npumem.units.format_size: "1.50 KiB", two decimals), and time as us/ms/s or entry index.
"use strict";
var NV = window.NV || (window.NV = {});

NV.fmt = (function () {
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  // The same text npumem's CLI and report print, so the page can be checked against them.
  function bytes(n) {
    if (n === null || n === undefined || isNaN(n)) return "–";
    var sign = n < 0 ? "-" : "";
    var v = Math.abs(n);
    for (var i = 0; i < UNITS.length; i++) {
      if (v < 1024) return i === 0 ? sign + Math.floor(v) + " B" : sign + v.toFixed(2) + " " + UNITS[i];
      v /= 1024;
    }
    return sign + v.toFixed(2) + " EiB";
  }

  // Axis labels: as short as the step allows ("1.5 GiB", "512 MiB").
  function bytesShort(n, step) {
    if (n === 0) return "0";
    var i = 0, size = Math.max(Math.abs(n), 1);
    while (i < UNITS.length - 1 && size >= 1024) { size /= 1024; i++; }
    var scale = Math.pow(1024, i), v = n / scale;
    // As many decimals as the step needs to tell neighbouring ticks apart.
    var digits = step ? Math.min(Math.max(Math.ceil(-Math.log10(step / scale) - 1e-9), 0), 3) : 2;
    var text = v.toFixed(digits);
    if (digits) text = text.replace(/\.?0+$/, "");          // "1.50" -> "1.5", never "10" -> "1"
    return text + " " + UNITS[i];
  }

  // A tick step for bytes: 1, 2, 5 x a power of ten of the unit that keeps labels short.
  function bytesStep(span, count) {
    var raw = span / Math.max(count, 1);
    var unit = 1;
    while (unit * 1024 <= raw) unit *= 1024;
    return niceStep(raw / unit) * unit;
  }

  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  // Time: `unit` is the source's time_unit, "us" or "entry". Values are relative to the
  // recording's start so that two sources share an axis and labels stay short.
  function time(v, unit, span) {
    if (unit === "entry") return "entry " + Math.round(v).toLocaleString("en-US");
    return duration(v, span);
  }

  function duration(us, span) {
    var s = Math.abs(span === undefined ? us : span);
    if (s >= 1e6) return trim(us / 1e6, s / 1e6) + " s";
    if (s >= 1e3) return trim(us / 1e3, s / 1e3) + " ms";
    return trim(us, s) + " us";
  }

  // Enough decimals to tell neighbouring ticks apart, no more.
  function trim(v, span) {
    var d = span >= 100 ? 0 : span >= 10 ? 1 : span >= 1 ? 2 : 3;
    return v.toFixed(d);
  }

  // One unit for a whole axis, from its largest value (171.04 s, not 171040 ms), and the
  // decimals its step needs.
  function timeTick(v, unit, step, largest) {
    if (unit === "entry") {
      var a = Math.abs(v);
      if (step >= 1e6 || a >= 1e7) return (v / 1e6).toFixed(step >= 1e6 ? 0 : 1) + "M";
      if (step >= 1e3 || a >= 1e4) return (v / 1e3).toFixed(step >= 1e3 ? 0 : 1) + "k";
      return String(Math.round(v));
    }
    // Decimals from the step, so ticks 0.1 s apart read "0.1 s", "0.2 s".
    var big = Math.max(Math.abs(largest || v), step);
    var unitScale = big >= 1e6 ? 1e6 : big >= 1e3 ? 1e3 : 1;
    var name = unitScale === 1e6 ? " s" : unitScale === 1e3 ? " ms" : " us";
    var d = Math.max(0, -Math.floor(Math.log10(step / unitScale) + 1e-9));
    return (v / unitScale).toFixed(Math.min(d, 6)) + name;
  }

  function plural(n, one, many) { return count(n) + " " + (n === 1 ? one : many || one + "s"); }

  function count(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); }

  function hex(n) {
    if (n === null || n === undefined) return "–";
    return typeof n === "number" ? "0x" + n.toString(16) : String(n);
  }

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  return { bytes: bytes, bytesShort: bytesShort, bytesStep: bytesStep, niceStep: niceStep,
           time: time, duration: duration, timeTick: timeTick, count: count, plural: plural, hex: hex, esc: esc };
})();
