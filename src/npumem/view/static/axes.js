// Canvas plumbing shared by the timeline, the overview, the icicle and the block map: a sharp
// canvas at any device pixel ratio, linear scales, and axes with units.
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

  function scale(d0, d1, r0, r1) {
    var k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
    var f = function (v) { return r0 + (v - d0) * k; };
    f.invert = function (p) { return k === 0 ? d0 : d0 + (p - r0) / k; };
    return f;
  }

  // Y axis in bytes: gridlines and labels in binary units.
  function bytesAxis(ctx, y, left, right, ymin, ymax, count) {
    var step = NV.fmt.bytesStep(ymax - ymin, count || 4);
    ctx.save();
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (var v = Math.ceil(ymin / step) * step; v <= ymax * 1.0001; v += step) {
      var py = Math.round(y(v)) + 0.5;
      ctx.strokeStyle = v === 0 ? "#999" : "#e6e6e6";
      ctx.beginPath(); ctx.moveTo(left, py); ctx.lineTo(right, py); ctx.stroke();
      ctx.fillStyle = "#333";
      ctx.fillText(NV.fmt.bytesShort(v, step), left - 6, py);
    }
    ctx.restore();
  }

  // X axis in the source's time unit, values relative to the recording's start.
  function timeAxis(ctx, x, r0, r1, unit, top, bottom, width) {
    var count = Math.max(2, Math.floor(width / 110));
    var step = NV.fmt.niceStep((r1 - r0) / count);
    if (unit === "entry") step = Math.max(1, step);
    ctx.save();
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (var v = Math.ceil(r0 / step) * step; v <= r1; v += step) {
      var px = Math.round(x(v)) + 0.5;
      ctx.strokeStyle = "#f0f0f0";
      ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, bottom); ctx.stroke();
      ctx.strokeStyle = "#999";
      ctx.beginPath(); ctx.moveTo(px, bottom); ctx.lineTo(px, bottom + 4); ctx.stroke();
      ctx.fillStyle = "#333";
      var text = NV.fmt.timeTick(v, unit, step, Math.max(Math.abs(r0), Math.abs(r1))), half = ctx.measureText(text).width / 2;
      // Labels stay inside the plot's width rather than being cut at the canvas edge.
      var lx = Math.min(Math.max(px, x(r0) + half), x(r1) - half);
      ctx.fillText(text, lx, bottom + 6);
    }
    ctx.restore();
  }

  function categoryColour(index) { return CATEGORY[index % CATEGORY.length]; }

  return { fit: fit, scale: scale, bytesAxis: bytesAxis, timeAxis: timeAxis, INK: INK,
           WHATIF: WHATIF, categoryColour: categoryColour };
})();
