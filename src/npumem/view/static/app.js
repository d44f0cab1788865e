// The page's wiring: ask the server what it serves, write the sources and the OOM at the top,
// start the timeline, and connect its clicks to the panels below.
"use strict";
var NV = window.NV || (window.NV = {});

NV.legend = (function () {
  var D = NV.draw;
  function swatch(style, text) { return "<span><i style='" + style + "'></i>" + NV.fmt.esc(text) + "</span>"; }
  function update() {
    var S = NV.timeline.state, info = S.info, html = [];
    html.push(swatch("background:" + D.INK.reserved + ";height:2px", "reserved"));
    html.push(swatch("background:" + D.INK.allocated + ";height:2px", "allocated (band: least to most in a pixel)"));
    if (info.sources.some(function (s) { return s.has_active; })) html.push(swatch("border-top:2px dashed " + D.INK.active + ";height:0", "active"));
    var cats = [];
    info.sources.forEach(function (s) { (s.categories || []).forEach(function (c) { if (cats.indexOf(c) < 0) cats.push(c); }); });
    cats.forEach(function (c) {
      var i = S.categories.indexOf(c);
      if (i < 0) { S.categories.push(c); i = S.categories.length - 1; }
      html.push(swatch("background:" + D.categoryColour(i) + ";opacity:.8", c));
    });
    html.push(swatch("border-top:2px dashed " + D.INK.step + ";height:0", "step (dashed; dotted with ? where inferred)"));
    html.push("<span><b class='mark-up'>▲</b> segment mapped</span><span><b class='mark-down'>▼</b> unmapped</span>");
    if (info.sources.some(function (s) { return s.oom; })) html.push(swatch("background:" + D.INK.oom + ";width:3px", "out of memory"));
    if (S.allocation) html.push(swatch("background:" + D.INK.lifetimeBar + ";height:4px",
      "lifetime of allocation " + S.allocation.id + (info.sources.length > 1 ? " (" + String.fromCharCode(65 + S.allocation.source) + ")" : "")));
    S.whatifs.forEach(function (w) {
      if (w.visible) html.push(swatch("border-top:2px dashed " + w.colour + ";height:0", "what-if " + w.setting));
    });
    var notes = [];
    S.lanes.slice(1).forEach(function (lane) {
      if (S.stretch) notes.push("B is stretched to A's length: the axis is A's time; the hover gives B's own.");
      else if (!NV.timeline.sameUnit(lane)) notes.push("B counts " + (lane.src.time_unit === "entry" ? "entries" : "time") +
        " and A does not: B's lane shows the same fraction of its own recording.");
    });
    if (S.lanes.length > 1) notes.push("Both lanes share one byte scale; time counts from each recording's start.");
    document.getElementById("legend").innerHTML = html.join("") +
      notes.map(function (n) { return "<p class='muted'>" + NV.fmt.esc(n) + "</p>"; }).join("");
  }
  return { update: update };
})();

NV.app = (function () {
  var F = NV.fmt, info = null;

  function sources(info) {
    var box = document.getElementById("sources");
    box.innerHTML = "";
    info.sources.forEach(function (s, i) {
      var div = document.createElement("div");
      div.className = "source";
      var name = info.sources.length > 1 ? String.fromCharCode(65 + i) + ": " : "";
      var bits = [s.kind, F.count(s.entries) + (s.time_unit === "entry" ? " entries" : " events"),
                  s.time_unit === "entry" ? "no timestamps: time is the entry index"
                                          : F.duration(s.t_max - s.t_min) + " long",
                  s.device_total ? "device " + F.bytes(s.device_total) : null,
                  // The report's peaks, in its words, so the two can be read side by side.
                  s.peak_allocated !== undefined ? "peak allocated " + F.bytes(s.peak_allocated) : null,
                  s.peak_reserved !== undefined ? "peak reserved " + F.bytes(s.peak_reserved) : null,
                  F.count(s.segments) + " segments"].filter(Boolean);
      div.innerHTML = "<strong></strong> <span class='muted'></span>";
      div.firstChild.textContent = name + s.path;
      div.lastChild.textContent = bits.join(" · ");
      box.appendChild(div);
    });
  }

  function oom(info) {
    var box = document.getElementById("oom");
    var ooms = info.sources.map(function (s, i) { return [s, i]; }).filter(function (x) { return x[0].oom; });
    if (!ooms.length) return;
    box.innerHTML = "";
    ooms.forEach(function (x) {
      var s = x[0], i = x[1], p = document.createElement("div");
      var at = F.time(s.oom.t - s.t_min, s.time_unit);
      p.innerHTML = "<strong>Out of memory" + (info.sources.length > 1 ? " in " + String.fromCharCode(65 + i) : "") +
        "</strong> at " + F.esc(at) + ": <span class='oom-message'></span><p class='oom-answer'></p>" +
        "<details><summary>Why, and what each setting would have done (the report's explanation)</summary>" +
        "<pre class='oom-explanation'></pre></details>";
      p.querySelector(".oom-message").textContent = s.oom.message || "";
      explain(p, s.oom);
      p.setAttribute("data-source", String(i));
      var b = document.createElement("button");
      b.type = "button"; b.textContent = "Show the moment before it";
      b.onclick = function () { showAround(s, s.oom.t); moment(i, s.oom.t); };
      p.appendChild(b);
      box.appendChild(p);
    });
    box.hidden = false;
    if (ooms.some(function (x) { return x[0].oom.explanation_pending; })) setTimeout(explanations, 1500);
  }

  // The report's explanation is long (the stack, every setting's shortfall): its answer line is
  // shown at once, the rest folded.
  function explain(box, oom) {
    var text = oom.explanation || "", pre = box.querySelector(".oom-explanation");
    var answer = /^\s*answer:.*$/m.exec(text);
    pre.textContent = text || (oom.explanation_pending ? "Working out why (the allocator model's state at the OOM)…"
                                                        : "(no explanation)");
    box.querySelector(".oom-answer").textContent = answer ? answer[0].trim() :
      (oom.explanation_pending ? "Working out why…" : "");
  }

  // The server explains an OOM in the background (a replay through the model): ask again until
  // it has, then fill the explanation in.
  function explanations() {
    NV.api.get("/api/info").then(function (fresh) {
      var pending = false;
      fresh.sources.forEach(function (s, i) {
        if (!s.oom) return;
        var el = document.querySelector("#oom [data-source='" + i + "']");
        if (s.oom.explanation_pending) { pending = true; return; }
        info.sources[i].oom = s.oom;
        if (el) explain(el, s.oom);
      });
      if (pending) setTimeout(explanations, 1500);
    }).catch(function (err) { NV.api.showError("OOM explanation", err); });
  }

  // Centre the timeline on a source's time t, keeping a tenth of the recording around it.
  function showAround(src, t) {
    var S = NV.timeline.state, lane = S.lanes[src.id] || S.lanes[0];
    var r = t - src.t_min;
    var v = NV.timeline.sameUnit(lane) ? r : r / Math.max(src.t_max - src.t_min, 1) * S.full;
    var half = Math.min(S.view.v1 - S.view.v0, S.full / 10) / 2;
    NV.timeline.setView(v - half, v + half, "now");
  }

  function moment(sourceId, t) {
    NV.timeline.setMoment({ source: sourceId, t: t });
    select("moment");
    NV.moment.show(info, sourceId, t);
  }

  function allocation(sourceId, id) {
    select("allocation");
    NV.allocation.show(info, sourceId, id);
  }

  // Tabs: arrow keys move between them, as the ARIA tabs pattern asks.
  function tabs() {
    var list = Array.prototype.slice.call(document.querySelectorAll("[role=tab]"));
    list.forEach(function (t, i) {
      t.onclick = function () { select(t.id.slice(4)); };
      t.onkeydown = function (e) {
        var d = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
        if (!d) return;
        var next = list[(i + d + list.length) % list.length];
        next.focus(); select(next.id.slice(4));
      };
    });
  }

  function select(name) {
    document.querySelectorAll("[role=tab]").forEach(function (t) {
      var on = t.id === "tab-" + name;
      t.setAttribute("aria-selected", on ? "true" : "false");
      t.tabIndex = on ? 0 : -1;
      document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
    });
    if (!info) return;
    if (name === "leaks") info.sources.forEach(function (s, i) { NV.leaks.show(info, i); });
    if (name === "host") info.sources.forEach(function (s, i) { NV.host.show(info, i); });
  }

  // The range form reads numbers in the first source's unit, from its start; "ms", "s", "us"
  // and "k"/"M" (entries) suffixes are understood.
  function parseTime(text, unit) {
    var m = /^\s*(-?[\d.]+)\s*([a-zA-Zµ]*)\s*$/.exec(text);
    if (!m) return NaN;
    var v = parseFloat(m[1]), u = m[2].toLowerCase();
    var k = { "": 1, us: 1, "µs": 1, ms: 1e3, s: 1e6, k: 1e3, m: 1e6 }[u];
    if (unit === "entry" && (u === "ms" || u === "s" || u === "us")) return NaN;
    return k === undefined ? NaN : v * k;
  }

  function rangeForm() {
    var f = document.getElementById("range"), a = document.getElementById("range-t0"), b = document.getElementById("range-t1");
    f.onsubmit = function (e) {
      e.preventDefault();
      var unit = NV.timeline.state.unit, v0 = parseTime(a.value, unit), v1 = parseTime(b.value, unit);
      if (!(isFinite(v0) && isFinite(v1) && v1 > v0)) {
        NV.api.showError("range", new Error("cannot read '" + a.value + "' to '" + b.value + "' as a range: give two numbers, " +
          (unit === "entry" ? "entry indices (e.g. 120k)" : "in us, or with ms or s (e.g. 1.5 s)") + ", the first smaller"));
        return;
      }
      NV.timeline.setView(v0, v1, "now");
    };
    document.getElementById("zoom-in").onclick = function () { NV.timeline.zoom(0.5); };
    document.getElementById("zoom-out").onclick = function () { NV.timeline.zoom(2); };
    document.getElementById("zoom-reset").onclick = function () { NV.timeline.setView(0, Infinity, "now"); };
  }

  function onRange(view) {
    var unit = NV.timeline.state.unit;
    var show = function (v) { return unit === "entry" ? String(Math.round(v)) : formatUs(v); };
    document.getElementById("range-t0").value = show(view.v0);
    document.getElementById("range-t1").value = show(view.v1);
    document.getElementById("range-unit").textContent = unit === "entry" ? "entries from the first" : "from the start";
  }
  function formatUs(v) {
    if (Math.abs(v) >= 1e6) return +(v / 1e6).toFixed(6) + " s";
    if (Math.abs(v) >= 1e3) return +(v / 1e3).toFixed(3) + " ms";
    return +v.toFixed(1) + " us";
  }

  function start() {
    tabs();
    rangeForm();
    NV.moment.setAllocationHandler(allocation);
    NV.api.get("/api/info").then(function (i) {
      info = i;
      if (!info.sources || !info.sources.length) throw new Error("the server serves no source");
      info.sources.forEach(function (s, k) { if (s.id === undefined) s.id = k; });
      sources(info);
      oom(info);
      NV.timeline.init(info, moment, onRange);
      if (info.sources.length > 1) {
        document.getElementById("stretch-box").hidden = false;
        document.getElementById("stretch").onchange = function (e) { NV.timeline.stretch(e.target.checked); NV.legend.update(); };
      }
      NV.legend.update();
      NV.whatif.init(info);
      select("moment");
    }).catch(function (err) {
      document.getElementById("sources").textContent = "The server could not describe its sources.";
      NV.api.showError("info", err);
    });
  }

  return { start: start, showAround: showAround, parseTime: parseTime };
})();

NV.app.start();
