// Drawing shared by the page: a sharp canvas at any device pixel ratio for the hand-drawn
// icicle and block map; axes with units and step paths for the uPlot charts.
"use strict";
var NV = window.NV || (window.NV = {});

NV.draw = (function () {
  // Okabe–Ito colours: told apart with the common colour-vision deficiencies. Categories use
  // light tints so that the allocated and reserved lines drawn over them stay readable.
  var CATEGORY = ["#56b4e9", "#e69f00", "#009e73", "#f0e442", "#cc79a7", "#0072b2", "#d55e00",
                  "#999999", "#88ccee", "#ddcc77", "#117733", "#aa4499"];
  var INK = { allocated: "#0b3c6e", reserved: "#111111", active: "#6a3d9a", device: "#888888",
              map: "#00805a", unmap: "#c0392b", step: "#555555", annotation: "#7b3294",
              oom: "#d00000", moment: "#005fcc", select: "rgba(0, 95, 204, 0.15)",
              lifetime: "rgba(140, 81, 10, 0.05)", lifetimeBar: "#8c510a" };
  var WHATIF = ["#d55e00", "#cc79a7", "#009e73", "#0072b2"];

  // Size the backing store to the element's CSS size times the pixel ratio; returns a context
  // whose units are CSS pixels.
  function fit(canvas, cssHeight) {
    var ratio = window.devicePixelRatio || 1;
    var w = canvas.clientWidth || canvas.parentNode.clientWidth || 800;
    var h = cssHeight || canvas.clientHeight || 100;
    if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
      canvas.width = Math.round(w * ratio);
      canvas.height = Math.round(h * ratio);
      canvas.style.height = h + "px";
    }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    return { ctx: ctx, w: w, h: h };
  }

  // Axes for uPlot (the timeline, the overview, the pinned host chart): bytes up the side in
  // binary units, ticks a 1-2-5 step of the unit that keeps labels short; time along the bottom
  // in the source's unit from its start, one unit for the whole axis. uPlot places them.
  var AXIS = 72;                                  // the byte axis' width: lanes line up with it
  var RIGHT = 30;         // room on the right for half a time label centred on the plot's edge
  var FONT = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
  // Tick steps of 1, 2 and 5 times a power of ten (not uPlot's 2.5, which one decimal would
  // print as "0.3 ms"): from a thousandth of a microsecond, or from one entry.
  var TIME_STEPS = [], ENTRY_STEPS = [];
  for (var e = -3; e <= 13; e++) [1, 2, 5].forEach(function (m) {
    var step = +(m + "e" + e);                   // exact decimals: 0.002, not 0.0020000000000000005
    TIME_STEPS.push(step);
    if (e >= 0) ENTRY_STEPS.push(step);
  });

  function bytesAxis() {
    return {
      scale: "y", size: AXIS, gap: 6, font: FONT, stroke: "#333", ticks: { show: false },
      grid: { stroke: "#e6e6e6", width: 1 },
      splits: function (u, i, lo, hi) {
        var rows = Math.max(2, Math.floor(u.bbox.height / uPlot.pxRatio / 45));
        var step = NV.fmt.bytesStep(hi - lo, rows), out = [];
        for (var v = Math.ceil(lo / step) * step; v <= hi * 1.0001; v += step) out.push(v);
        return out;
      },
      values: function (u, splits) {
        var step = splits.length > 1 ? splits[1] - splits[0] : 0;
        return splits.map(function (v) { return NV.fmt.bytesShort(v, step); });
      },
    };
  }

  function timeAxis(unit) {
    return {
      scale: "x", space: 110, gap: 4, font: FONT, stroke: "#333", size: 26,
      grid: { stroke: "#f0f0f0", width: 1 }, ticks: { stroke: "#999", width: 1, size: 4 },
      incrs: unit === "entry" ? ENTRY_STEPS : TIME_STEPS,
      values: function (u, splits, i, space, step) {
        var sc = u.scales.x, largest = Math.max(Math.abs(sc.min || 0), Math.abs(sc.max || 0));
        return splits.map(function (v) { return NV.fmt.timeTick(v, unit, step, largest); });
      },
    };
  }

  // A series drawn as steps: bucket i covers [x[i], x[i+1]).
  var stepped = null;
  function steps() { return stepped || (stepped = uPlot.paths.stepped({ align: 1 })); }

  function categoryColour(index) { return CATEGORY[index % CATEGORY.length]; }

  return { fit: fit, bytesAxis: bytesAxis, timeAxis: timeAxis, steps: steps, INK: INK,
           WHATIF: WHATIF, categoryColour: categoryColour, AXIS: AXIS, RIGHT: RIGHT, FONT: FONT };
})();
