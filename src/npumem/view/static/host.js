// Pinned host memory: PyTorch 2.14 also records its pinned (page-locked) host allocator, as
// host_segments and host_traces. Shown as the server reads it; sources without it say so.
"use strict";
var NV = window.NV || (window.NV = {});

NV.host = (function () {
  var F = NV.fmt, loaded = {};

  function show(info, sourceId) {
    var panel = document.getElementById("panel-host");
    if (loaded[sourceId]) return;
    loaded[sourceId] = true;
    var box = document.createElement("div");
    panel.appendChild(box);
    var name = info.sources.length > 1 ? String.fromCharCode(65 + sourceId) + ": " : "";
    if (!info.sources[sourceId].host) {
      box.innerHTML = "<p class='muted'>" + F.esc(name) + "this recording has no pinned host memory (PyTorch writes it from 2.14, as host_segments and host_traces).</p>";
      return;
    }
    box.innerHTML = "<p class='muted'>Loading…</p>";
    NV.api.get("/api/host", { source: sourceId }).then(function (r) {
      box.innerHTML = name ? "<h3>" + F.esc(name + info.sources[sourceId].path) + "</h3>" : "";
      if (r.host === false) {
        box.insertAdjacentHTML("beforeend", "<p class='muted'>No pinned host memory was recorded.</p>");
        return;
      }
      render(box, r, info.sources[sourceId]);
    }).catch(function (err) {
      loaded[sourceId] = false;
      box.innerHTML = "<p class='error-inline'>Pinned host memory could not be loaded: " + F.esc(err.message) + "</p>";
      NV.api.showError("host", err);
    });
  }

  function render(box, r, src) {
    var p = document.createElement("p");
    p.textContent = F.plural(r.segment_count, "pinned segment") + ", " + F.bytes(r.reserved) + " held; " +
      F.plural(r.entries, "trace entry", "trace entries") + (r.actions && r.actions.length ? " (" + r.actions.join(", ") + ")" : "") + ".";
    box.appendChild(p);
    var tl = r.timeline || {};
    if (tl.t && tl.t.length) {
      box.insertAdjacentHTML("beforeend", "<h3>Pinned bytes allocated over time</h3>");
      var el = document.createElement("div");
      el.className = "host-chart";
      el.setAttribute("role", "img");
      el.setAttribute("aria-label", "Pinned host bytes allocated over the recording, at most " +
        F.bytes(Math.max.apply(null, tl.allocated)));
      box.appendChild(el);
      chart(el, tl, src);
    }
    var segs = r.segments || [];
    if (segs.length) {
      box.insertAdjacentHTML("beforeend", "<h3>Segments</h3>");
      var t = document.createElement("table");
      t.className = "generic";
      t.innerHTML = "<thead><tr><th>address</th><th class='num'>size</th><th class='num'>allocated</th>" +
        "<th class='num'>blocks</th><th>fields recorded</th></tr></thead>";
      var body = document.createElement("tbody");
      segs.forEach(function (s) {
        var tr = document.createElement("tr");
        [F.hex(s.address), F.bytes(s.size), F.bytes(s.allocated), F.count(s.blocks), (s.keys || []).join(", ")]
          .forEach(function (v, i) {
            var td = document.createElement("td");
            if (i > 0 && i < 4) td.className = "num";
            td.textContent = v; tr.appendChild(td);
          });
        body.appendChild(tr);
      });
      t.appendChild(body);
      box.appendChild(t);
      if (r.segment_count > segs.length) {
        box.insertAdjacentHTML("beforeend", "<p class='muted'>the first " + F.count(segs.length) + " of " + F.count(r.segment_count) + "</p>");
      }
    }
  }

  // A step line of the pinned bytes, a uPlot chart on the same axes as the timeline's.
  function chart(el, tl, src) {
    var D = NV.draw, xs = tl.t.map(function (t) { return t - src.t_min; });
    var ymax = Math.max.apply(null, tl.allocated.concat([1])) * 1.08;
    // The panel may be hidden while it loads: its width is the page's until it is shown.
    var width = Math.min(el.clientWidth || el.parentNode.clientWidth || document.body.clientWidth - 40, 1100);
    new uPlot({
      width: width, height: 160, padding: [10, D.RIGHT, 0, 0], legend: { show: false },
      scales: { x: { time: false }, y: { auto: false, range: function () { return [0, ymax]; } } },
      axes: [D.timeAxis(src.time_unit), D.bytesAxis()],
      series: [{}, { label: "pinned allocated", stroke: D.INK.allocated, width: 1.5, paths: D.steps(),
                     points: { show: false } }],
      cursor: { y: false, points: { show: false }, drag: { x: false, y: false } },
    }, [xs, tl.allocated], el);
  }

  return { show: show };
})();
