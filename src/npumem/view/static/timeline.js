// The timeline: one lane per source on one shared time axis, and an overview strip of the whole
// recording, each a uPlot chart (static/uPlot.iife.min.js). The server aggregates each range at
// the lane's pixel width, so a zoom or pan costs one small request whatever the recording's
// size; until it answers, the data already here is drawn at the new range so the page follows
// the mouse. uPlot draws the series, bands, axes, cursor and selection; its hooks draw the marks
// (segments, steps, annotations, the OOM, the open allocation's lifetime) and take the clicks.
"use strict";
var NV = window.NV || (window.NV = {});

NV.timeline = (function () {
  var D = NV.draw, F = NV.fmt;
  var PAD = [24, D.RIGHT, 0, 0];                  // top, right, bottom, left: room for step labels
  var S = {
    info: null, lanes: [], full: 1, unit: "us", view: { v0: 0, v1: 1 }, overview: [],
    moment: null, allocation: null, whatifs: [], drag: null, ext: { lo: 0, hi: 1 },
    pending: null, timer: 0, seq: 0, draws: 0, ready: false, ov: null,
  };
  var hooks = { moment: function () {}, range: function () {} };

  // ---- ranges --------------------------------------------------------------------------------
  // View coordinates are the first source's time (or entry) relative to its start. A second
  // source shares them when its unit is the same; otherwise its lane shows the same fraction of
  // its own recording, and the legend says so. Each lane's chart is in its own time from its
  // start ("lane time"), so its ticks are round numbers of its own unit.
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
      answers.forEach(function (d, i) { S.lanes[i].data = d; S.lanes[i].dirty = true; });
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
    var width = Math.round(document.getElementById("overview").clientWidth - D.AXIS - PAD[1]);
    Promise.all(S.lanes.map(function (lane) {
      return NV.api.get("/api/timeline", { source: lane.src.id, t0: lane.src.t_min,
                                           t1: lane.src.t_max, width: Math.max(width, 100) });
    })).then(function (answers) { S.overview = answers; makeOverview(); })
      .catch(function (err) { NV.api.showError("overview", err); });
  }

  function status(text) { document.getElementById("range-status").textContent = text; }

  // ---- the byte scale ------------------------------------------------------------------------
  // It starts at zero, so heights compare; "fit" starts it near the range's least value instead,
  // for a run whose changes sit on a large constant base.
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

  // ---- a lane's series -----------------------------------------------------------------------
  // The server's answer as uPlot's columns: x is each bucket's start in lane time and, last, the
  // end of the last bucket (each value is repeated there so that its step reaches it). The
  // categories are stacked, each one's top clipped under the allocated line (by_category holds
  // each category's most in a bucket: maxima from different moments could rise above it).
  function seriesOf(lane) {
    var d = lane.data, src = lane.src, t0 = src.t_min;
    var n = d && d.t ? d.t.length : 0, cols = [], specs = [], bands = [];
    var xs = new Array(n + 1);
    for (var i = 0; i < n; i++) xs[i] = d.t[i] - t0;
    if (n) xs[n] = (n > 1 ? d.t[n - 1] + (d.bucket || d.t[n - 1] - d.t[n - 2]) : d.t1) - t0;
    function column(vals) {
      var out = new Array(n + 1);
      for (var i = 0; i < n; i++) out[i] = vals ? vals[i] : null;
      if (n) out[n] = out[n - 1];
      return out;
    }
    function add(spec, vals) { specs.push(spec); cols.push(vals); return specs.length; }
    var base = { paths: D.steps(), points: { show: false } };
    function spec(more) { return Object.assign({}, base, more); }
    var hidden = { stroke: "rgba(0,0,0,0)", width: 0 };

    var byCat = (d && d.by_category) || {}, present = (src.categories || []).filter(function (c) { return byCat[c]; });
    Object.keys(byCat).forEach(function (c) { if (present.indexOf(c) < 0) present.push(c); });
    var cap = d && d.allocated ? d.allocated.max : null, below = new Float64Array(n), lower = 0;
    present.forEach(function (c, k) {
      var vals = byCat[c], above = new Array(n);
      for (var i = 0; i < n; i++) {
        var v = below[i] + (vals[i] || 0);
        above[i] = cap ? Math.min(v, cap[i]) : v;
      }
      var colour = D.categoryColour(colourIndex(c)) + "bf";           // 75% opaque
      var idx = add(spec(Object.assign({ label: c }, hidden, k ? {} : { fill: colour })), column(above));
      if (k) bands.push({ series: [idx, lower], fill: colour });
      below = Float64Array.from(above); lower = idx;
    });
    if (d && d.allocated) {
      if (!present.length) add(spec(Object.assign({ label: "allocated fill", fill: "rgba(86,180,233,0.45)" }, hidden)), column(d.allocated.max));
      // The band between a bucket's least and most allocated: how much it moved in the bucket.
      var least = add(spec(Object.assign({ label: "least allocated" }, hidden)), column(d.allocated.min));
      var most = add(spec({ label: "allocated", stroke: D.INK.allocated, width: 1.5 }), column(d.allocated.max));
      bands.push({ series: [most, least], fill: "rgba(11,60,110,0.18)" });
    }
    if (d && d.active) add(spec({ label: "active", stroke: D.INK.active, width: 1.25, dash: [5, 3] }), column(d.active.max));
    if (d && d.reserved) add(spec({ label: "reserved", stroke: D.INK.reserved, width: 1.5 }), column(d.reserved.max));
    // What-if replays: each one's reserved bytes, the most in each bucket, as its own series.
    S.whatifs.forEach(function (w) {
      if (w.source !== src.id || !w.visible || !w.result.t.length || !n) return;
      add(spec({ label: "what-if " + w.setting, stroke: w.colour, width: 2, dash: [7, 4] }),
          column(bucketMax(w.result.t, w.result.reserved, d.t, xs[n] + t0)));
    });
    var key = specs.map(function (s) { return s.label + (s.stroke || ""); }).join("|");
    return { key: key, specs: specs, bands: bands, data: [xs].concat(cols) };
  }

  // The most of a step curve (values `ys` from times `ts` on) in each bucket that starts at
  // `starts[i]` and ends at the next start (the last at `end`); null before the curve begins.
  function bucketMax(ts, ys, starts, end) {
    var out = new Array(starts.length), j = -1, lo = 0, hi = ts.length - 1;
    while (lo <= hi) { var mid = (lo + hi) >> 1; if (ts[mid] <= starts[0]) { j = mid; lo = mid + 1; } else hi = mid - 1; }
    for (var i = 0; i < starts.length; i++) {
      var stop = i + 1 < starts.length ? starts[i + 1] : end, m = j >= 0 ? ys[j] : null;
      while (j + 1 < ts.length && ts[j + 1] < stop) { j++; m = m === null ? ys[j] : Math.max(m, ys[j]); }
      out[i] = m;
    }
    return out;
  }

  // One colour per category name across both sources.
  function colourIndex(name) {
    var all = S.categories, i = all.indexOf(name);
    if (i < 0) { all.push(name); i = all.length - 1; }
    return i;
  }

  // ---- drawing -------------------------------------------------------------------------------
  function plotWidth(lane) {
    return lane.plot ? lane.plot.bbox.width / uPlot.pxRatio : (lane.el.clientWidth || 800) - D.AXIS - PAD[1];
  }

  function drawAll() {
    S.ext = extent();
    S.lanes.forEach(drawLane);
    drawOverview();
  }

  function drawLane(lane) {
    if (lane.dirty || !lane.plot) {
      var s = seriesOf(lane);
      if (!lane.plot || s.key !== lane.key) makeLane(lane, s);
      else lane.plot.setData(s.data, false);
      lane.key = s.key;
      lane.dirty = false;
    }
    var u = lane.plot;
    u.batch(function () {
      u.setScale("x", { min: toLane(lane, S.view.v0), max: toLane(lane, S.view.v1) });
      u.setScale("y", { min: S.ext.lo, max: S.ext.hi });
    });
  }

  function makeLane(lane, s) {
    if (lane.plot) lane.plot.destroy();
    var title = (S.lanes.length > 1 ? String.fromCharCode(65 + lane.index) + ": " : "") + lane.src.path;
    var opts = {
      title: title, width: lane.el.clientWidth || 800, height: lane.height, padding: PAD,
      legend: { show: false },
      scales: {
        x: { time: false, auto: false, range: function () { return [toLane(lane, S.view.v0), toLane(lane, S.view.v1)]; } },
        y: { auto: false, range: function () { return [S.ext.lo, S.ext.hi]; } },
      },
      axes: [D.timeAxis(lane.src.time_unit), D.bytesAxis()],
      series: [{ label: "time" }].concat(s.specs),
      bands: s.bands,
      cursor: {
        y: false, points: { show: false },
        drag: { x: true, y: false, setScale: false, dist: 5 },
        // Shift+drag pans: the drag is the page's, uPlot's selection is not started.
        bind: { mousedown: function (u, target, handler) {
          return function (e) {
            lane.el.focus({ preventScroll: true });
            if (e.button === 0 && e.shiftKey) { startPan(lane, e); return null; }
            return handler(e);
          };
        } },
      },
      hooks: {
        drawClear: [function (u) { underMarks(u, lane); }],
        draw: [function (u) { overMarks(u, lane); }],
        setSelect: [function (u) { selected(u, lane); }],
        setCursor: [function (u) { tooltip(u, lane); }],
      },
    };
    lane.plot = new uPlot(opts, s.data, lane.el);
    var over = lane.plot.over;
    over.addEventListener("mousedown", function (e) { lane.down = e.clientX; });
    over.addEventListener("click", function (e) {
      if (e.shiftKey || lane.down === undefined || Math.abs(e.clientX - lane.down) > 4) return;
      pick(lane, fromLane(lane, lane.plot.posToVal(e.clientX - over.getBoundingClientRect().left, "x")));
    });
    over.addEventListener("wheel", function (e) { wheel(e, lane); }, { passive: false });
    over.addEventListener("mouseleave", hideTooltip);
  }

  // Drawing in CSS pixels inside uPlot's hooks: its canvas is in device pixels.
  function frame(u) {
    var r = uPlot.pxRatio, ctx = u.ctx;
    ctx.save();
    ctx.setTransform(r, 0, 0, r, 0, 0);
    // uPlot leaves its last series' dash and its axes' alignment set: start from plain ink.
    ctx.setLineDash([]); ctx.lineWidth = 1; ctx.globalAlpha = 1;
    ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
    ctx.font = "11px system-ui, sans-serif";
    var g = { ctx: ctx, L: u.bbox.left / r, T: u.bbox.top / r, W: u.bbox.width / r, H: u.bbox.height / r };
    g.R = g.L + g.W; g.B = g.T + g.H;
    g.x = function (v) { return g.L + u.valToPos(v, "x"); };
    g.y = function (v) { return g.T + u.valToPos(v, "y"); };
    g.clip = function () { ctx.beginPath(); ctx.rect(g.L, 0, g.W, g.B); ctx.clip(); };
    return g;
  }
  function vline(g, px, colour, width, dash) {
    var ctx = g.ctx;
    ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.setLineDash(dash);
    ctx.beginPath(); ctx.moveTo(Math.round(px) + 0.5, g.T); ctx.lineTo(Math.round(px) + 0.5, g.B); ctx.stroke();
    ctx.setLineDash([]); ctx.lineWidth = 1;
  }

  // Under the series: past the recording's end (nothing is known there), and the open
  // allocation's lifetime, a bar with its two ends marked down the plot (a long-lived one would
  // hide the plot under a full-height shade).
  function underMarks(u, lane) {
    var g = frame(u), ctx = g.ctx, src = lane.src, t0 = src.t_min;
    g.clip();
    var end = Math.min(Math.max(g.x(src.t_max - t0), g.L), g.R);
    if (end < g.R - 1) {
      ctx.fillStyle = "#f1f1f1"; ctx.fillRect(end, g.T, g.R - end, g.H);
      ctx.fillStyle = "#777"; ctx.textBaseline = "top"; ctx.font = "12px system-ui, sans-serif";
      if (g.R - end > 110) ctx.fillText("end of recording", end + 6, g.T + 24);
    }
    var a = S.allocation;
    if (a && a.source === src.id) {
      var open = a.t_free === null || a.t_free === undefined;
      var la = g.x(a.t_alloc - t0), lb = open ? g.R + 10 : g.x(a.t_free - t0);
      ctx.fillStyle = D.INK.lifetime; ctx.fillRect(la, g.T, Math.max(lb - la, 2), g.H);
      // The bar sits under the annotations' ticks and labels (the top 20 pixels).
      ctx.fillStyle = D.INK.lifetimeBar; ctx.fillRect(la, g.T + 22, Math.max(lb - la, 2), 4);
      vline(g, la, D.INK.lifetimeBar, 1, [2, 2]);
      if (!open) vline(g, lb, D.INK.lifetimeBar, 1, [2, 2]);
    }
    ctx.restore();
  }

  // Over the series: the device's total, segments mapped (▲) and unmapped (▼) along the bottom,
  // steps, annotations, the moment shown below, and the OOM over everything.
  function overMarks(u, lane) {
    var g = frame(u), ctx = g.ctx, src = lane.src, t0 = src.t_min, d = lane.data;
    var total = src.device_total;
    if (total && total <= S.ext.hi) {
      var py = Math.round(g.y(total)) + 0.5;
      ctx.strokeStyle = D.INK.device; ctx.setLineDash([2, 3]);
      ctx.beginPath(); ctx.moveTo(g.L, py); ctx.lineTo(g.R, py); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = "#555"; ctx.textAlign = "right"; ctx.textBaseline = "bottom"; ctx.font = "12px system-ui, sans-serif";
      ctx.fillText("device total " + F.bytes(total), g.R - 4, py - 2);
      ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "left";
    }
    ctx.save();
    g.clip();
    ((d && d.segments_marks) || []).forEach(function (m) {
      var px = g.x(m.t - t0), up = m.kind === "map", b = g.B;
      ctx.fillStyle = up ? D.INK.map : D.INK.unmap;
      ctx.beginPath();
      if (up) { ctx.moveTo(px - 4, b); ctx.lineTo(px + 4, b); ctx.lineTo(px, b - 7); }
      else { ctx.moveTo(px - 4, b - 7); ctx.lineTo(px + 4, b - 7); ctx.lineTo(px, b); }
      ctx.fill();
    });
    ctx.restore();
    stepMarks(g, src);
    annotationMarks(g, src);
    if (S.moment && S.moment.source === src.id) {
      var pm = g.x(S.moment.t - t0);
      if (pm >= g.L - 1 && pm <= g.R + 1) vline(g, pm, D.INK.moment, 2, []);
    }
    // The OOM is often the recording's last entry, on the plot's right edge: kept inside it.
    if (src.oom) {
      var po = g.x(src.oom.t - t0);
      if (po >= g.L - 2 && po <= g.R + 2) {
        po = Math.min(Math.max(po, g.L + 1), g.R - 1);
        vline(g, po, D.INK.oom, 2, []);
        ctx.fillStyle = D.INK.oom; ctx.font = "700 12px system-ui, sans-serif"; ctx.textBaseline = "bottom";
        var nearRight = po > g.R - 40;
        ctx.textAlign = nearRight ? "right" : "left";
        ctx.fillText("OOM", nearRight ? po - 4 : po + 4, g.T + 46);
      }
    }
    ctx.restore();
  }

  // Steps: a dashed line each (dotted where inferred), labelled above the plot where the label
  // does not run into the previous one.
  function stepMarks(g, src) {
    var ctx = g.ctx, t0 = src.t_min, lastLabel = -1e9;
    ctx.textBaseline = "bottom"; ctx.textAlign = "left"; ctx.font = "11px system-ui, sans-serif";
    (src.steps || []).forEach(function (s) {
      var px = g.x(s.t - t0);
      if (px < g.L - 1 || px > g.R + 1) return;
      vline(g, px, D.INK.step, 1, s.source === "marked" ? [4, 3] : [1, 3]);
      var text = s.label + (s.source === "inferred" ? "?" : "");
      var wide = ctx.measureText(text).width;
      var lx = px + 2 + wide > g.R ? px - 2 - wide : px + 2;
      if (lx > lastLabel + 8) {                 // lastLabel: where the previous label ends
        ctx.fillStyle = "#444"; ctx.fillText(text, lx, g.T);
        lastLabel = lx + wide;
      }
    });
  }

  // Annotations can be thousands (torch.compile marks each pass's start and end): a short tick
  // each along the top, with a label only where there is room; the hover names them.
  function annotationMarks(g, src) {
    var ctx = g.ctx, t0 = src.t_min, lastLabel = -1e9;
    // an annotation that marks a step already drawn there (a profile's optimizer.step) is not
    // named twice
    var stepAt = {};
    (src.steps || []).forEach(function (s) { stepAt[Math.round(g.x(s.t - t0))] = true; });
    var anns = (src.annotations || []).filter(function (a) {
      var px = g.x(a.t - t0), at = Math.round(px);
      return px >= g.L - 1 && px <= g.R + 1 && !stepAt[at] && !stepAt[at - 1] && !stepAt[at + 1];
    });
    ctx.textBaseline = "bottom"; ctx.textAlign = "left"; ctx.font = "11px system-ui, sans-serif";
    anns.forEach(function (a) {
      var px = Math.round(g.x(a.t - t0)) + 0.5;
      ctx.strokeStyle = D.INK.annotation;
      ctx.beginPath(); ctx.moveTo(px, g.T); ctx.lineTo(px, g.T + 8); ctx.stroke();
      var label = a.label.length > 28 ? a.label.slice(0, 27) + "…" : a.label;
      var wide = ctx.measureText(label).width;
      if (anns.length <= 60 && px + 3 > lastLabel + 8 && px + 3 + wide <= g.R) {
        ctx.fillStyle = D.INK.annotation; ctx.fillText(label, px + 3, g.T + 19);
        lastLabel = px + 3 + wide;
      }
    });
  }

  // ---- the overview strip --------------------------------------------------------------------
  // The whole recording, both sources in view coordinates, with the range shown framed; a drag
  // across it picks a range, a click centres the range there.
  function makeOverview() {
    var el = document.getElementById("overview");
    if (S.ov) { S.ov.destroy(); S.ov = null; }
    if (!S.overview.length) return;
    var tables = [], specs = [];
    S.overview.forEach(function (d, k) {
      var lane = S.lanes[k], t0 = lane.src.t_min, n = d.t.length;
      if (!n) return;
      var xs = [], al = [], re = [];
      for (var i = 0; i < n; i++) { xs.push(fromLane(lane, d.t[i] - t0)); al.push(d.allocated.max[i]); re.push(d.reserved ? d.reserved.max[i] : null); }
      var end = fromLane(lane, (n > 1 ? d.t[n - 1] + (d.bucket || d.t[n - 1] - d.t[n - 2]) : d.t1) - t0);
      if (end > xs[n - 1]) { xs.push(end); al.push(al[n - 1]); re.push(re[n - 1]); }
      tables.push([xs, al, re]);
      var dash = k ? [3, 2] : undefined, base = { paths: D.steps(), points: { show: false }, spanGaps: true, width: 1, dash: dash };
      specs.push(Object.assign({ label: "allocated", stroke: k ? "#b35806" : D.INK.allocated }, base));
      specs.push(Object.assign({ label: "reserved", stroke: k ? "#e08214" : "#666" }, base));
    });
    if (!tables.length) return;
    var data = tables.length > 1 ? uPlot.join(tables) : tables[0];
    var top = 1;
    for (var i = 1; i < data.length; i++) for (var j = 0; j < data[i].length; j++) if (data[i][j] > top) top = data[i][j];
    var hide = { show: true, size: D.AXIS, values: function (u, splits) { return splits.map(function () { return ""; }); },
                 grid: { show: false }, ticks: { show: false } };
    S.ov = new uPlot({
      width: el.clientWidth || 800, height: 44, padding: [2, PAD[1], 2, 0], legend: { show: false },
      scales: { x: { time: false, auto: false, range: function () { return [0, S.full]; } },
                y: { auto: false, range: function () { return [0, top * 1.05]; } } },
      axes: [{ show: false }, Object.assign({ scale: "y" }, hide)],
      series: [{}].concat(specs),
      cursor: { y: false, points: { show: false }, drag: { x: true, y: false, setScale: false, dist: 3 } },
      hooks: {
        drawClear: [function (u) {
          var g = frame(u); g.ctx.fillStyle = "#fafafa"; g.ctx.fillRect(g.L, g.T, g.W, g.H); g.ctx.restore();
        }],
        draw: [overviewMarks],
        setSelect: [function (u) {
          if (u.select.width < 3) return;
          var a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
          setTimeout(function () { setView(a, b, "now"); }, 0);
        }],
      },
    }, data, el);
    S.ov.setScale("x", { min: 0, max: S.full });
    var over = S.ov.over, down;
    over.addEventListener("mousedown", function (e) { down = e.clientX; });
    over.addEventListener("click", function (e) {
      if (down === undefined || Math.abs(e.clientX - down) > 2) return;
      var c = S.ov.posToVal(e.clientX - over.getBoundingClientRect().left, "x"), span = S.view.v1 - S.view.v0;
      setView(c - span / 2, c + span / 2, "now");
    });
  }

  function overviewMarks(u) {
    var g = frame(u), ctx = g.ctx;
    S.lanes.forEach(function (lane) {
      if (lane.src.oom) vline(g, g.x(fromLane(lane, lane.src.oom.t - lane.src.t_min)), D.INK.oom, 2, []);
    });
    var a = g.x(S.view.v0), b = g.x(S.view.v1);
    ctx.fillStyle = "rgba(0,0,0,0.08)";
    ctx.fillRect(g.L, g.T, a - g.L, g.H); ctx.fillRect(b, g.T, g.R - b, g.H);
    ctx.strokeStyle = D.INK.moment; ctx.lineWidth = 2; ctx.strokeRect(a, g.T + 1, Math.max(b - a, 2), g.H - 2);
    ctx.fillStyle = "#333"; ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.font = "12px system-ui, sans-serif";
    ctx.fillText("whole", g.L - 6, g.T + g.H / 2);
    ctx.restore();
  }

  function drawOverview() {
    if (S.ov) S.ov.setScale("x", { min: 0, max: S.full });
  }

  // ---- interaction ---------------------------------------------------------------------------
  function zoom(factor, centre) {
    var c = centre === undefined ? (S.view.v0 + S.view.v1) / 2 : centre;
    setView(c - (c - S.view.v0) * factor, c + (S.view.v1 - c) * factor);
  }
  function pan(fraction) {
    var span = S.view.v1 - S.view.v0;
    setView(S.view.v0 + span * fraction, S.view.v1 + span * fraction);
  }

  // A drag across a lane: uPlot's selection, zoomed to once released.
  function selected(u, lane) {
    if (u.select.width <= 4) return;
    var a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
    setTimeout(function () { setView(fromLane(lane, a), fromLane(lane, b), "now"); }, 0);
  }

  function startPan(lane, e) {
    hideTooltip();
    S.drag = { lane: lane, x0: e.clientX, view: { v0: S.view.v0, v1: S.view.v1 } };
  }
  window.addEventListener("mousemove", function (e) {
    var drag = S.drag;
    if (!drag) return;
    var span = drag.view.v1 - drag.view.v0, dv = -(e.clientX - drag.x0) / Math.max(plotWidth(drag.lane), 1) * span;
    var a = Math.min(Math.max(drag.view.v0 + dv, 0), S.full - span);
    S.view = { v0: a, v1: a + span };
    writeHash(); hooks.range(S.view);
    drawAll(); schedule(120);
  });
  window.addEventListener("mouseup", function () {
    if (!S.drag) return;
    S.drag = null;
    schedule(0);
  });

  function wheel(e, lane) {
    e.preventDefault();
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      pan((e.shiftKey ? e.deltaY : e.deltaX) / 600);
    } else {
      var px = e.clientX - lane.plot.over.getBoundingClientRect().left;
      zoom(Math.pow(1.0015, e.deltaY), fromLane(lane, lane.plot.posToVal(px, "x")));
    }
  }

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
    else if (k === "Escape") {
      S.drag = null;
      S.lanes.forEach(function (l) { l.plot && l.plot.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false); });
    }
    else if (k === "y") { var box = document.getElementById("fit-y"); box.checked = !box.checked; fitY(box.checked); }
    else return;
    e.preventDefault();
  }

  // ---- hover readout -------------------------------------------------------------------------
  function bucketAt(d, t) {
    var lo = 0, hi = d.t.length - 1;
    if (hi < 0 || t < d.t[0]) return -1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (d.t[mid] <= t) lo = mid; else hi = mid - 1; }
    return lo;
  }

  function tooltip(u, lane) {
    var d = lane.data, tip = document.getElementById("tooltip"), left = u.cursor.left;
    if (S.drag || !d || !d.t || left === undefined || left < 0) return hideTooltip();
    var r = u.posToVal(left, "x");
    var i = bucketAt(d, lane.src.t_min + r);
    if (i < 0) return hideTooltip();
    var rows = [["time", F.time(r, lane.src.time_unit, u.scales.x.max - u.scales.x.min)]];
    var range = function (s) { return s.min && s.min[i] !== s.max[i] ? F.bytes(s.min[i]) + " – " + F.bytes(s.max[i]) : F.bytes(s.max[i]); };
    if (d.allocated) rows.push(["allocated", range(d.allocated)]);
    if (d.active) rows.push(["active", range(d.active)]);
    if (d.reserved) rows.push(["reserved", range(d.reserved)]);
    Object.keys(d.by_category || {}).forEach(function (c) {
      if (d.by_category[c][i]) rows.push(["· " + c, F.bytes(d.by_category[c][i])]);
    });
    u.series.forEach(function (s, k) {
      if (s.label && s.label.indexOf("what-if ") === 0 && u.data[k][i] !== null) rows.push([s.label, F.bytes(u.data[k][i])]);
    });
    var perPixel = (u.scales.x.max - u.scales.x.min) / Math.max(plotWidth(lane), 1);
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
    var box = u.over.getBoundingClientRect();
    var pageX = box.left + window.scrollX + left, pageY = box.top + window.scrollY + u.cursor.top;
    var x = pageX + 16, width = tip.offsetWidth;
    if (x + width > window.scrollX + document.documentElement.clientWidth) x = pageX - width - 16;
    tip.style.left = x + "px";
    tip.style.top = (pageY + 12) + "px";
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
      var el = document.createElement("div");
      el.className = "lane";
      el.tabIndex = 0;
      el.setAttribute("role", "img");
      el.setAttribute("aria-label", "Memory over time of " + src.path +
        ": use the arrow keys to pan, + and − to zoom, Enter for the moment at the centre");
      box.appendChild(el);
      var lane = { index: i, src: src, el: el, data: null, dirty: true, plot: null,
                   height: info.sources.length > 1 ? 210 : 280 };
      el.addEventListener("keydown", function (e) { key(e, lane); });
      return lane;
    });
    document.getElementById("overview").addEventListener("keydown", function (e) { key(e, S.lanes[0]); });
    document.getElementById("fit-y").onchange = function (e) { fitY(e.target.checked); };
    window.addEventListener("resize", function () {
      S.lanes.forEach(function (lane) { if (lane.plot) lane.plot.setSize({ width: lane.el.clientWidth, height: lane.height }); });
      if (S.ov) S.ov.setSize({ width: document.getElementById("overview").clientWidth, height: 44 });
      drawAll(); schedule(200);
    });
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
  function dirty() { S.lanes.forEach(function (lane) { lane.dirty = true; }); drawAll(); }
  function setMoment(m) { S.moment = m; drawAll(); }
  function setAllocation(a) { S.allocation = a; drawAll(); NV.legend.update(); }
  function addWhatif(w) { S.whatifs.push(w); dirty(); }

  return { init: init, setView: setView, zoom: zoom, pan: pan, setMoment: setMoment,
           setAllocation: setAllocation, addWhatif: addWhatif, redraw: dirty, state: S, stretch: stretch,
           sameUnit: sameUnit };
})();
