// The timeline: one lane per source on one shared time axis, and an overview strip of the whole
// recording. The server aggregates each range at the lane's pixel width, so a zoom or pan costs
// one small request whatever the recording's size; until it answers, the data already here is
// redrawn at the new range so the page follows the mouse.
"use strict";
var NV = window.NV || (window.NV = {});

NV.timeline = (function () {
  var D = NV.draw, F = NV.fmt, P = NV.plot;
  var edges = P.edges, stepPath = P.stepPath, stepBack = P.stepBack, line = P.line, vline = P.vline,
      drawSegmentMarks = P.segmentMarks;
  var M = { left: 78, right: 14, top: 24, bottom: 26 };   // plot margins, CSS pixels
  var S = {
    info: null, lanes: [], full: 1, unit: "us", view: { v0: 0, v1: 1 }, overview: [],
    moment: null, allocation: null, whatifs: [], hover: null, drag: null,
    pending: null, timer: 0, seq: 0, draws: 0, ready: false,
  };
  var hooks = { moment: function () {}, range: function () {} };

  // ---- ranges --------------------------------------------------------------------------------
  // View coordinates are the first source's time (or entry) relative to its start. A second
  // source shares them when its unit is the same; otherwise its lane shows the same fraction of
  // its own recording, and the legend says so.
  function spanOf(src) { return Math.max(src.t_max - src.t_min, 1); }
  function sameUnit(lane) { return lane.src.time_unit === S.unit && !(S.stretch && lane.index > 0); }
  function firstSpan() { return spanOf(S.lanes[0].src); }
  function toLane(lane, v) { return sameUnit(lane) ? v : v / firstSpan() * spanOf(lane.src); }
  function fromLane(lane, r) { return sameUnit(lane) ? r : r / spanOf(lane.src) * firstSpan(); }
  function minSpan() { return S.unit === "entry" ? 8 : Math.max(S.full * 1e-9, 1); }

  function setView(v0, v1, why) {
    var span = Math.max(v1 - v0, minSpan());
    if (span >= S.full) { v0 = 0; span = S.full; }
    v0 = Math.min(Math.max(v0, 0), S.full - span);
    S.view = { v0: v0, v1: v0 + span };
    writeHash();
    hooks.range(S.view);
    drawAll();
    schedule(why === "now" ? 0 : 90);
  }

  // The range lives in the address so a reload, or a link, opens it directly: a range can be
  // picked before any detail loads (#t0=..&t1=.. in the first source's units, from its start).
  function writeHash() {
    var h = "#t0=" + Math.round(S.view.v0) + "&t1=" + Math.round(S.view.v1);
    if (location.hash !== h) history.replaceState(null, "", location.pathname + location.search + h);
  }
  function readHash() {
    var q = new URLSearchParams(location.hash.slice(1));
    var a = parseFloat(q.get("t0")), b = parseFloat(q.get("t1"));
    return isFinite(a) && isFinite(b) && b > a ? { v0: a, v1: b } : null;
  }

  // ---- requests ------------------------------------------------------------------------------
  function schedule(delay) {
    clearTimeout(S.timer);
    S.timer = setTimeout(fetchDetail, delay);
  }

  function fetchDetail() {
    if (S.pending) S.pending.abort();               // only the newest range matters
    var ctrl = new AbortController();
    S.pending = ctrl;
    var seq = ++S.seq;
    var started = performance.now();
    status("loading…");
    document.documentElement.setAttribute("data-npumem-busy", "1");
    Promise.all(S.lanes.map(function (lane) {
      var a = lane.src.t_min + toLane(lane, S.view.v0), b = lane.src.t_min + toLane(lane, S.view.v1);
      return NV.api.get("/api/timeline", { source: lane.src.id, t0: a, t1: b,
                                           width: Math.round(plotWidth(lane)) }, ctrl.signal);
    })).then(function (answers) {
      if (seq !== S.seq) return;
      answers.forEach(function (d, i) { S.lanes[i].data = d; });
      S.pending = null;
      S.lastMs = performance.now() - started;
      var events = answers.map(function (d) { return F.count(d.events_in_range); }).join(" and ");
      status(events + " events in range · answered in " + Math.round(S.lastMs) + " ms");
      drawAll();
      S.draws++;
      var root = document.documentElement;
      root.setAttribute("data-npumem-draws", String(S.draws));
      root.setAttribute("data-npumem-busy", "0");
      if (!S.ready) { S.ready = true; root.setAttribute("data-npumem-ready", "1"); }
    }).catch(function (err) {
      if (err.name === "AbortError") return;
      document.documentElement.setAttribute("data-npumem-busy", "0");
      status("the timeline could not be loaded");
      NV.api.showError("timeline", err);
    });
  }

  function fetchOverview() {
    var width = Math.round(document.getElementById("overview").clientWidth - M.left - M.right);
    Promise.all(S.lanes.map(function (lane) {
      return NV.api.get("/api/timeline", { source: lane.src.id, t0: lane.src.t_min,
                                           t1: lane.src.t_max, width: Math.max(width, 100) });
    })).then(function (answers) { S.overview = answers; drawOverview(); })
      .catch(function (err) { NV.api.showError("overview", err); });
  }

  function status(text) { document.getElementById("range-status").textContent = text; }

  // ---- drawing -------------------------------------------------------------------------------
  function plotWidth(lane) { return (lane.canvas.clientWidth || 800) - M.left - M.right; }

  function drawAll() {
    var ext = extent();
    S.lanes.forEach(function (lane) { drawLane(lane, ext); });
    drawOverview();
  }

  // The byte axis starts at zero, so heights compare; "fit" starts it near the range's least
  // value instead, for a run whose changes sit on a large constant base.
  function extent() {
    var hi = commonMax(), lo = 0;
    if (S.fitY) {
      lo = Infinity;
      S.lanes.forEach(function (lane) {
        var d = lane.data;
        if (d) [d.allocated, d.reserved].forEach(function (s) {
          if (s && s.min) for (var i = 0; i < s.min.length; i++) if (s.min[i] < lo) lo = s.min[i];
        });
      });
      if (!isFinite(lo)) lo = 0;
      var top = hi / 1.06;
      lo = Math.max(0, lo - (top - lo) * 0.08);
      hi = top + (top - lo) * 0.06;
      var step = F.bytesStep(hi - lo, 4);
      lo = Math.floor(lo / step) * step;
    }
    return { lo: lo, hi: Math.max(hi, lo + 1) };
  }

  // Lanes share one byte scale so that two sources can be compared by height.
  function commonMax() {
    var m = 0;
    S.lanes.forEach(function (lane) {
      var d = lane.data;
      if (d) [d.reserved, d.allocated, d.active].forEach(function (s) {
        if (s && s.max) for (var i = 0; i < s.max.length; i++) if (s.max[i] > m) m = s.max[i];
      });
      S.whatifs.forEach(function (w) {
        if (w.source !== lane.src.id || !w.visible) return;
        var a = lane.src.t_min + toLane(lane, S.view.v0), b = lane.src.t_min + toLane(lane, S.view.v1);
        w.result.t.forEach(function (t, i) { if (t >= a && t <= b && w.result.reserved[i] > m) m = w.result.reserved[i]; });
      });
    });
    // The device's total is drawn when it is near enough to matter (an OOM, a near miss).
    S.lanes.forEach(function (lane) {
      var total = lane.src.device_total;
      if (total && m > 0 && total <= m * 1.35) m = Math.max(m, total);
    });
    return m > 0 ? m * 1.06 : 1024;
  }

  function laneScales(lane, ext, w, h) {
    var a = toLane(lane, S.view.v0), b = toLane(lane, S.view.v1);
    return { a: a, b: b, x: D.scale(a, b, M.left, w - M.right), y: D.scale(ext.lo, ext.hi, h - M.bottom, M.top) };
  }

  function drawLane(lane, ext) {
    var g = D.fit(lane.canvas, lane.height), ymax = ext.hi;
    var ctx = g.ctx, w = g.w, h = g.h, sc = laneScales(lane, ext, w, h);
    var x = sc.x, y = sc.y, top = M.top, bottom = h - M.bottom, t0 = lane.src.t_min;

    D.bytesAxis(ctx, y, M.left, w - M.right, ext.lo, ymax, Math.max(2, Math.floor((bottom - top) / 45)));
    D.timeAxis(ctx, x, sc.a, sc.b, lane.src.time_unit, top, bottom, w - M.left - M.right);
    // Past the recording's end nothing is known: shaded, and nothing is drawn there.
    var end = Math.min(Math.max(x(lane.src.t_max - t0), M.left), w - M.right);
    if (end < w - M.right - 1) {
      ctx.fillStyle = "#f1f1f1"; ctx.fillRect(end, top, w - M.right - end, bottom - top);
      ctx.fillStyle = "#777"; ctx.textAlign = "left"; ctx.textBaseline = "top";
      if (w - M.right - end > 110) ctx.fillText("end of recording", end + 6, top + 24);
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(M.left, 0, end - M.left, bottom); ctx.clip();

    // The open allocation's lifetime: a bar under the annotations, with its two ends marked
    // down the plot (a long-lived one would hide the plot under a full-height shade).
    if (S.allocation && S.allocation.source === lane.src.id) {
      var la = x(S.allocation.t_alloc - t0), open = S.allocation.t_free === null || S.allocation.t_free === undefined;
      var lb = open ? w : x(S.allocation.t_free - t0);
      ctx.fillStyle = D.INK.lifetime; ctx.fillRect(la, top, Math.max(lb - la, 2), bottom - top);
      ctx.fillStyle = D.INK.lifetimeBar; ctx.fillRect(la, top + 10, Math.max(lb - la, 2), 4);
      vline(ctx, la, top, bottom, D.INK.lifetimeBar, 1, [2, 2]);
      if (!open) vline(ctx, lb, top, bottom, D.INK.lifetimeBar, 1, [2, 2]);
    }
    var d = lane.data;
    if (d && d.t && d.t.length) drawSeries(ctx, lane, d, x, y, t0, bottom);
    drawWhatifs(ctx, lane, x, y, t0);
    drawDeviceTotal(ctx, lane, y, w, ymax);
    if (d) drawSegmentMarks(ctx, d, x, t0, bottom);
    drawMarks(ctx, lane, x, t0, top, bottom);
    if (S.moment && S.moment.source === lane.src.id) vline(ctx, x(S.moment.t - t0), top, bottom, D.INK.moment, 2, []);
    if (S.drag && S.drag.mode === "select" && S.drag.lane === lane) {
      var sa = Math.min(S.drag.x0, S.drag.x1), sb = Math.max(S.drag.x0, S.drag.x1);
      ctx.fillStyle = D.INK.select; ctx.fillRect(sa, top, sb - sa, bottom - top);
    }
    if (S.hover && S.hover.lane === lane) vline(ctx, S.hover.px, top, bottom, "rgba(0,0,0,0.35)", 1, []);
    ctx.restore();
    drawOom(ctx, lane, x, t0, top, bottom);

    ctx.fillStyle = "#111";
    ctx.textAlign = "left"; ctx.textBaseline = "top";
    ctx.font = "600 12px system-ui, sans-serif";
    var label = (S.lanes.length > 1 ? String.fromCharCode(65 + lane.index) + ": " : "") + lane.src.path;
    ctx.fillText(label, M.left + 4, 4);
    if (!d) { ctx.fillStyle = "#666"; ctx.fillText("loading…", M.left + 4, top + 8); }
  }

  function drawSeries(ctx, lane, d, x, y, t0, bottom) {
    var xs = edges(d, x, t0), n = d.t.length;
    var cats = lane.src.categories || [], byCat = d.by_category || {};
    var present = cats.filter(function (c) { return byCat[c]; });
    Object.keys(byCat).forEach(function (c) { if (present.indexOf(c) < 0) present.push(c); });
    if (present.length) {
      // by_category holds each category's most in a bucket: stacked, maxima from different
      // moments could rise above the allocated line, so the stack is clipped under it.
      ctx.save();
      if (d.allocated) {
        ctx.beginPath(); stepPath(ctx, xs, d.allocated.max, y, true);
        ctx.lineTo(xs[n], bottom + 1); ctx.lineTo(xs[0], bottom + 1); ctx.closePath(); ctx.clip();
      }
      var below = new Float64Array(n);
      present.forEach(function (c) {
        var vals = byCat[c], above = new Float64Array(n);
        for (var i = 0; i < n; i++) above[i] = below[i] + (vals[i] || 0);
        ctx.beginPath(); stepPath(ctx, xs, above, y, true); stepBack(ctx, xs, below, y); ctx.closePath();
        ctx.fillStyle = D.categoryColour(colourIndex(c)); ctx.globalAlpha = 0.75; ctx.fill(); ctx.globalAlpha = 1;
        below = above;
      });
      ctx.restore();
    } else if (d.allocated) {
      ctx.beginPath(); stepPath(ctx, xs, d.allocated.max, y, true);
      ctx.lineTo(xs[n], bottom); ctx.lineTo(xs[0], bottom); ctx.closePath();
      ctx.fillStyle = "rgba(86,180,233,0.45)"; ctx.fill();
    }
    // The band between a bucket's least and most allocated: how much it moved inside the bucket.
    if (d.allocated && d.allocated.min) {
      ctx.beginPath(); stepPath(ctx, xs, d.allocated.max, y, true); stepBack(ctx, xs, d.allocated.min, y); ctx.closePath();
      ctx.fillStyle = "rgba(11,60,110,0.18)"; ctx.fill();
    }
    line(ctx, xs, d.allocated && d.allocated.max, y, D.INK.allocated, 1.5, []);
    line(ctx, xs, d.active && d.active.max, y, D.INK.active, 1.25, [5, 3]);
    line(ctx, xs, d.reserved && d.reserved.max, y, D.INK.reserved, 1.5, []);
  }

  function drawWhatifs(ctx, lane, x, y, t0) {
    S.whatifs.forEach(function (wf) {
      if (wf.source !== lane.src.id || !wf.visible || !wf.result.t.length) return;
      var ts = wf.result.t, rs = wf.result.reserved;
      ctx.beginPath();
      for (var i = 0; i < ts.length; i++) {
        var px = x(ts[i] - t0), py = y(rs[i]);
        if (i === 0) ctx.moveTo(px, py); else { ctx.lineTo(px, y(rs[i - 1])); ctx.lineTo(px, py); }
      }
      ctx.strokeStyle = wf.colour; ctx.lineWidth = 2; ctx.setLineDash([7, 4]); ctx.stroke();
      ctx.setLineDash([]); ctx.lineWidth = 1;
    });
  }

  function drawDeviceTotal(ctx, lane, y, w, ymax) {
    var total = lane.src.device_total;
    if (!total || total > ymax) return;
    var py = Math.round(y(total)) + 0.5;
    ctx.strokeStyle = D.INK.device; ctx.setLineDash([2, 3]);
    ctx.beginPath(); ctx.moveTo(M.left, py); ctx.lineTo(w - M.right, py); ctx.stroke(); ctx.setLineDash([]);
    ctx.fillStyle = "#555"; ctx.textAlign = "right"; ctx.textBaseline = "bottom";
    ctx.fillText("device total " + F.bytes(total), w - M.right - 4, py - 2);
  }

  function drawMarks(ctx, lane, x, t0, top, bottom) {
    var src = lane.src, lastLabel = -1e9;
    ctx.textBaseline = "bottom"; ctx.textAlign = "left";
    ctx.font = "11px system-ui, sans-serif";
    var right = lane.canvas.clientWidth - M.right;
    (src.steps || []).forEach(function (s) {
      var px = x(s.t - t0);
      if (px < M.left - 1 || px > right + 1) return;
      vline(ctx, px, top, bottom, D.INK.step, 1, s.source === "marked" ? [4, 3] : [1, 3]);
      var text = s.label + (s.source === "inferred" ? "?" : "");
      var wide = ctx.measureText(text).width;
      var lx = px + 2 + wide > right ? px - 2 - wide : px + 2;
      if (lx > lastLabel + 8) {                 // lastLabel: where the previous label ends
        ctx.fillStyle = "#444";
        ctx.fillText(text, lx, top);
        lastLabel = lx + wide;
      }
    });
    // Annotations can be thousands (torch.compile marks each pass's start and end): a short
    // tick each along the top, with a label only where there is room; the hover names them.
    var anns = (src.annotations || []).filter(function (a) {
      var px = x(a.t - t0); return px >= M.left - 1 && px <= right + 1;
    });
    lastLabel = -1e9;
    anns.forEach(function (a) {
      var px = Math.round(x(a.t - t0)) + 0.5;
      ctx.strokeStyle = D.INK.annotation;
      ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + 8); ctx.stroke();
      var label = a.label.length > 28 ? a.label.slice(0, 27) + "…" : a.label;
      var wide = ctx.measureText(label).width;
      if (anns.length <= 60 && px + 3 > lastLabel + 8 && px + 3 + wide <= right) {
        ctx.fillStyle = D.INK.annotation; ctx.fillText(label, px + 3, top + 19);
        lastLabel = px + 3 + wide;              // where this label ends
      }
    });
  }

  // The OOM, drawn over everything and kept inside the plot: it is often the recording's last
  // entry, on the plot's right edge.
  function drawOom(ctx, lane, x, t0, top, bottom) {
    var oom = lane.src.oom, right = lane.canvas.clientWidth - M.right;
    if (!oom) return;
    var po = x(oom.t - t0);
    if (po < M.left - 2 || po > right + 2) return;
    po = Math.min(Math.max(po, M.left + 1), right - 1);
    vline(ctx, po, top, bottom, D.INK.oom, 2, []);
    ctx.fillStyle = D.INK.oom; ctx.font = "700 12px system-ui, sans-serif";
    var nearRight = po > right - 40;
    ctx.textAlign = nearRight ? "right" : "left";
    ctx.fillText("OOM", nearRight ? po - 4 : po + 4, top + 34);
    ctx.font = "12px system-ui, sans-serif";
  }

  // One colour per category name across both sources.
  function colourIndex(name) {
    var all = S.categories;
    var i = all.indexOf(name);
    if (i < 0) { all.push(name); i = all.length - 1; }
    return i;
  }

  function drawOverview() {
    var canvas = document.getElementById("overview");
    var g = D.fit(canvas, 44), ctx = g.ctx, w = g.w, h = g.h;
    var x = D.scale(0, S.full, M.left, w - M.right);
    ctx.fillStyle = "#fafafa"; ctx.fillRect(M.left, 0, w - M.left - M.right, h);
    var m = 0;
    S.overview.forEach(function (d) { (d.reserved && d.reserved.max || d.allocated.max).forEach(function (v) { if (v > m) m = v; }); });
    var y = D.scale(0, m || 1, h - 3, 4);
    S.overview.forEach(function (d, k) {
      var lane = S.lanes[k], t0 = lane.src.t_min;
      var xl = function (t) { return x(fromLane(lane, t - t0)); };
      xl.invert = x.invert;
      var xs = edges(d, xl, 0);
      line(ctx, xs, d.allocated.max, y, k ? "#b35806" : D.INK.allocated, 1, k ? [3, 2] : []);
      if (d.reserved) line(ctx, xs, d.reserved.max, y, k ? "#e08214" : "#666", 1, k ? [3, 2] : []);
      if (lane.src.oom) vline(ctx, xl(lane.src.oom.t), 0, h, D.INK.oom, 2, []);
    });
    var a = x(S.view.v0), b = x(S.view.v1);
    if (S.drag && S.drag.mode === "overview") { a = Math.min(S.drag.x0, S.drag.x1); b = Math.max(S.drag.x0, S.drag.x1); }
    ctx.fillStyle = "rgba(0,0,0,0.08)";
    ctx.fillRect(M.left, 0, a - M.left, h); ctx.fillRect(b, 0, w - M.right - b, h);
    ctx.strokeStyle = D.INK.moment; ctx.lineWidth = 2; ctx.strokeRect(a, 1, Math.max(b - a, 2), h - 2); ctx.lineWidth = 1;
    ctx.fillStyle = "#333"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText("whole", M.left - 6, h / 2);
  }

  // ---- interaction ---------------------------------------------------------------------------
  function viewAt(lane, px) {
    var w = lane.canvas.clientWidth;
    var x = D.scale(S.view.v0, S.view.v1, M.left, w - M.right);
    return x.invert(px);
  }

  function zoom(factor, centre) {
    var c = centre === undefined ? (S.view.v0 + S.view.v1) / 2 : centre;
    setView(c - (c - S.view.v0) * factor, c + (S.view.v1 - c) * factor);
  }
  function pan(fraction) {
    var span = S.view.v1 - S.view.v0;
    setView(S.view.v0 + span * fraction, S.view.v1 + span * fraction);
  }

  function attachLane(lane) {
    var c = lane.canvas;
    c.addEventListener("mousedown", function (e) {
      if (e.button !== 0) return;
      e.preventDefault();
      c.focus();
      S.drag = { lane: lane, mode: e.shiftKey ? "pan" : "select", x0: e.offsetX, x1: e.offsetX,
                 view: { v0: S.view.v0, v1: S.view.v1 } };
    });
    c.addEventListener("mousemove", function (e) {
      if (S.drag && S.drag.lane === lane) {
        S.drag.x1 = e.offsetX;
        if (S.drag.mode === "pan") {
          var dv = viewAt(lane, S.drag.x0) - viewAt(lane, S.drag.x1);
          var v = S.drag.view, span = v.v1 - v.v0;
          var a = Math.min(Math.max(v.v0 + dv * (span / (S.view.v1 - S.view.v0)), 0), S.full - span);
          S.view = { v0: a, v1: a + span };
          drawAll(); schedule(120);
        } else drawAll();
        return;
      }
      S.hover = { lane: lane, px: e.offsetX };
      drawLane(lane, extent());
      tooltip(lane, e);
    });
    c.addEventListener("mouseleave", function () {
      S.hover = null; hideTooltip(); drawLane(lane, extent());
    });
    c.addEventListener("wheel", function (e) {
      e.preventDefault();
      if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
        pan((e.shiftKey ? e.deltaY : e.deltaX) / 600);
      } else {
        zoom(Math.pow(1.0015, e.deltaY), viewAt(lane, e.offsetX));
      }
    }, { passive: false });
    c.addEventListener("keydown", function (e) { key(e, lane); });
  }

  window.addEventListener("mouseup", function (e) {
    var drag = S.drag;
    if (!drag) return;
    S.drag = null;
    if (drag.mode === "overview") {
      var cv = document.getElementById("overview");
      var x = D.scale(0, S.full, M.left, cv.clientWidth - M.right);
      if (Math.abs(drag.x1 - drag.x0) > 3) {
        setView(x.invert(Math.min(drag.x0, drag.x1)), x.invert(Math.max(drag.x0, drag.x1)), "now");
      } else {
        var span = S.view.v1 - S.view.v0, c = x.invert(drag.x0);
        setView(c - span / 2, c + span / 2, "now");
      }
      return;
    }
    var lane = drag.lane;
    if (drag.mode === "select" && Math.abs(drag.x1 - drag.x0) > 4) {
      var a = viewAt(lane, Math.min(drag.x0, drag.x1)), b = viewAt(lane, Math.max(drag.x0, drag.x1));
      setView(a, b, "now");
    } else if (drag.mode === "select") {
      pick(lane, viewAt(lane, drag.x0));
    } else {
      schedule(0);
    }
  });

  function pick(lane, v) {
    var t = lane.src.t_min + toLane(lane, v);
    if (lane.src.time_unit === "entry") t = Math.round(t);
    S.moment = { source: lane.src.id, t: t };
    drawAll();
    hooks.moment(lane.src.id, t);
  }

  function key(e, lane) {
    var k = e.key;
    if (k === "ArrowLeft") pan(e.shiftKey ? -0.5 : -0.1);
    else if (k === "ArrowRight") pan(e.shiftKey ? 0.5 : 0.1);
    else if (k === "+" || k === "=") zoom(0.5);
    else if (k === "-" || k === "_") zoom(2);
    else if (k === "0" || k === "Home") setView(0, S.full, "now");
    else if (k === "Enter" && lane) pick(lane, (S.view.v0 + S.view.v1) / 2);
    else if (k === "Escape") { S.drag = null; drawAll(); }
    else if (k === "y") { var box = document.getElementById("fit-y"); box.checked = !box.checked; fitY(box.checked); }
    else return;
    e.preventDefault();
  }

  function attachOverview() {
    var c = document.getElementById("overview");
    c.addEventListener("mousedown", function (e) {
      e.preventDefault();
      S.drag = { mode: "overview", x0: e.offsetX, x1: e.offsetX };
    });
    c.addEventListener("mousemove", function (e) {
      if (S.drag && S.drag.mode === "overview") { S.drag.x1 = e.offsetX; drawOverview(); }
    });
    c.addEventListener("keydown", function (e) { key(e, S.lanes[0]); });
  }

  // ---- hover readout -------------------------------------------------------------------------
  function bucketAt(d, t) {
    var lo = 0, hi = d.t.length - 1;
    if (hi < 0 || t < d.t[0]) return -1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (d.t[mid] <= t) lo = mid; else hi = mid - 1; }
    return lo;
  }

  function tooltip(lane, e) {
    var d = lane.data, tip = document.getElementById("tooltip");
    var r = toLane(lane, viewAt(lane, e.offsetX));
    if (!d || !d.t || r < toLane(lane, S.view.v0) || r > toLane(lane, S.view.v1)) return hideTooltip();
    var i = bucketAt(d, lane.src.t_min + r);
    if (i < 0) return hideTooltip();
    var rows = [["time", F.time(r, lane.src.time_unit, S.view.v1 - S.view.v0)]];
    var range = function (s) { return s.min && s.min[i] !== s.max[i] ? F.bytes(s.min[i]) + " – " + F.bytes(s.max[i]) : F.bytes(s.max[i]); };
    if (d.allocated) rows.push(["allocated", range(d.allocated)]);
    if (d.active) rows.push(["active", range(d.active)]);
    if (d.reserved) rows.push(["reserved", range(d.reserved)]);
    Object.keys(d.by_category || {}).forEach(function (c) {
      if (d.by_category[c][i]) rows.push(["· " + c, F.bytes(d.by_category[c][i])]);
    });
    var perPixel = (toLane(lane, S.view.v1) - toLane(lane, S.view.v0)) / Math.max(plotWidth(lane), 1);
    var near = (lane.src.annotations || []).filter(function (a) {
      return Math.abs(a.t - lane.src.t_min - r) <= 3 * perPixel;
    });
    near.slice(0, 4).forEach(function (a) { rows.push(["annotation", a.label]); });
    if (near.length > 4) rows.push(["", "and " + (near.length - 4) + " more annotations here"]);
    (lane.src.steps || []).forEach(function (s) {
      if (Math.abs(s.t - lane.src.t_min - r) <= 3 * perPixel) rows.push(["step", s.label + " (" + s.source + ")"]);
    });
    tip.innerHTML = "<table>" + rows.map(function (r) {
      return "<tr><th>" + F.esc(r[0]) + "</th><td>" + F.esc(r[1]) + "</td></tr>";
    }).join("") + "</table><div class='muted'>click: what is live here</div>";
    tip.hidden = false;
    var left = e.pageX + 16, width = tip.offsetWidth;
    if (left + width > window.scrollX + document.documentElement.clientWidth) left = e.pageX - width - 16;
    tip.style.left = left + "px";
    tip.style.top = (e.pageY + 12) + "px";
  }
  function hideTooltip() { document.getElementById("tooltip").hidden = true; }

  // ---- setup ---------------------------------------------------------------------------------
  function init(info, onMoment, onRange) {
    hooks.moment = onMoment; hooks.range = onRange;
    S.info = info;
    S.categories = [];
    var first = info.sources[0];
    S.unit = first.time_unit;
    S.full = Math.max.apply(null, info.sources.map(function (s) {
      return s.time_unit === S.unit ? spanOf(s) : spanOf(first);
    }));
    S.jointFull = S.full;
    var box = document.getElementById("lanes");
    box.innerHTML = "";
    S.lanes = info.sources.slice(0, 2).map(function (src, i) {
      var c = document.createElement("canvas");
      c.className = "lane";
      c.tabIndex = 0;
      c.setAttribute("role", "img");
      c.setAttribute("aria-label", "Memory over time of " + src.path +
        ": use the arrow keys to pan, + and − to zoom, Enter for the moment at the centre");
      box.appendChild(c);
      var lane = { index: i, src: src, canvas: c, data: null, height: info.sources.length > 1 ? 230 : 300 };
      attachLane(lane);
      return lane;
    });
    attachOverview();
    document.getElementById("fit-y").onchange = function (e) { fitY(e.target.checked); };
    window.addEventListener("resize", function () { drawAll(); schedule(200); });
    var start = readHash() || { v0: 0, v1: S.full };
    setView(start.v0, start.v1, "now");
    fetchOverview();
  }

  function fitY(on) { S.fitY = on; drawAll(); }
  // Two runs of different lengths: B drawn over A's length (its own time scaled), so their
  // shapes line up; the hover still gives B's own times.
  function stretch(on) {
    S.stretch = on;
    S.full = on ? firstSpan() : S.jointFull;
    setView(0, S.full, "now");
    fetchOverview();
  }
  function setMoment(m) { S.moment = m; drawAll(); }
  function setAllocation(a) { S.allocation = a; drawAll(); NV.legend.update(); }
  function addWhatif(w) { S.whatifs.push(w); drawAll(); }
  function redraw() { drawAll(); }

  return { init: init, setView: setView, zoom: zoom, pan: pan, setMoment: setMoment,
           setAllocation: setAllocation, addWhatif: addWhatif, redraw: redraw, state: S, stretch: stretch,
           sameUnit: sameUnit };
})();
