// Drawing a server-aggregated series on a canvas: buckets as steps, lines over them, and marks.
// No state: the timeline and the overview call these with their own scales.
"use strict";
var NV = window.NV || (window.NV = {});

NV.plot = (function () {
  // Bucket i covers [t[i], t[i+1]): drawn as steps, so a spike stays as wide as its bucket.
  function edges(d, x, t0) {
    var n = d.t.length, xs = new Float64Array(n + 1);
    for (var i = 0; i < n; i++) xs[i] = x(d.t[i] - t0);
    xs[n] = x((n > 1 ? d.t[n - 1] + (d.bucket || d.t[n - 1] - d.t[n - 2]) : d.t1) - t0);
    return xs;
  }

  function stepPath(ctx, xs, vals, y, moveFirst) {
    for (var i = 0; i < vals.length; i++) {
      var py = y(vals[i] || 0);
      if (i === 0 && moveFirst) ctx.moveTo(xs[0], py); else ctx.lineTo(xs[i], py);
      ctx.lineTo(xs[i + 1], py);
    }
  }
  function stepBack(ctx, xs, vals, y) {
    for (var i = vals.length - 1; i >= 0; i--) { var py = y(vals[i] || 0); ctx.lineTo(xs[i + 1], py); ctx.lineTo(xs[i], py); }
  }

  function line(ctx, xs, vals, y, colour, width, dash) {
    if (!vals || !vals.length) return;
    ctx.beginPath(); stepPath(ctx, xs, vals, y, true);
    ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.setLineDash(dash); ctx.stroke();
    ctx.setLineDash([]); ctx.lineWidth = 1;
  }

  // Segments mapped (▲) and unmapped (▼) along the bottom edge.
  function segmentMarks(ctx, d, x, t0, bottom) {
    (d.segments_marks || []).forEach(function (m) {
      var px = x(m.t - t0), up = m.kind === "map";
      ctx.fillStyle = up ? NV.draw.INK.map : NV.draw.INK.unmap;
      ctx.beginPath();
      if (up) { ctx.moveTo(px - 4, bottom); ctx.lineTo(px + 4, bottom); ctx.lineTo(px, bottom - 7); }
      else { ctx.moveTo(px - 4, bottom - 7); ctx.lineTo(px + 4, bottom - 7); ctx.lineTo(px, bottom); }
      ctx.fill();
    });
  }

  function vline(ctx, px, top, bottom, colour, width, dash) {
    ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.setLineDash(dash);
    ctx.beginPath(); ctx.moveTo(Math.round(px) + 0.5, top); ctx.lineTo(Math.round(px) + 0.5, bottom); ctx.stroke();
    ctx.setLineDash([]); ctx.lineWidth = 1;
  }

  return { edges: edges, stepPath: stepPath, stepBack: stepBack, line: line, vline: vline,
           segmentMarks: segmentMarks };
})();
