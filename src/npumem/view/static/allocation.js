// One allocation: its size, address and stream, when it was allocated and freed (its lifetime is
// shaded on the timeline), its category, and the stack that allocated it.
"use strict";
var NV = window.NV || (window.NV = {});

NV.allocation = (function () {
  var F = NV.fmt;

  function show(info, sourceId, id) {
    var panel = document.getElementById("panel-allocation");
    var src = info.sources[sourceId];
    panel.innerHTML = "<p class='muted'>Loading allocation " + F.esc(id) + "…</p>";
    return NV.api.get("/api/allocation", { source: sourceId, id: id }).then(function (a) {
      var rel = function (t) { return t === null || t === undefined ? null : F.time(t - src.t_min, src.time_unit); };
      var freed = a.t_free !== null && a.t_free !== undefined;
      var life = freed ? (src.time_unit === "entry" ? F.count(a.t_free - a.t_alloc) + " entries"
                                                    : F.duration(a.t_free - a.t_alloc)) : "still live at the end of the recording";
      var rows = [
        ["size", F.bytes(a.size) + " (" + F.count(a.size) + " bytes)"],
        ["asked for", a.requested !== undefined && a.requested !== null && a.requested !== a.size
          ? F.bytes(a.requested) + " (the rest is the allocator's rounding)" : null],
        ["the user's line", a.site || null],
        ["address", F.hex(a.address)], ["stream", a.stream], ["category", a.category || "–"],
        ["allocated at", rel(a.t_alloc)], ["freed at", freed ? rel(a.t_free) : "never"], ["lifetime", life],
      ];
      panel.innerHTML = "<h3>Allocation " + F.esc(a.id) + (info.sources.length > 1 ? " of " + String.fromCharCode(65 + sourceId) : "") + "</h3>" +
        "<table class='kv'>" + rows.filter(function (r) { return r[1] !== null; }).map(function (r) {
          return "<tr><th>" + F.esc(r[0]) + "</th><td>" + F.esc(r[1]) + "</td></tr>";
        }).join("") + "</table>";
      var stack = a.stack || [];
      var h = document.createElement("h3");
      h.textContent = stack.length ? "Stack (innermost first)" : "No stack was recorded for this allocation.";
      panel.appendChild(h);
      if (stack.length) {
        var ol = document.createElement("ol");
        ol.className = "stack";
        stack.forEach(function (f) {
          var li = document.createElement("li");
          li.innerHTML = "<code>" + F.esc(f.name || "?") + "</code> <span class='muted'>" + F.esc(f.file || "?") + ":" + F.esc(f.line === undefined ? "?" : f.line) + "</span>";
          ol.appendChild(li);
        });
        panel.appendChild(ol);
      }
      NV.timeline.setAllocation({ id: a.id, source: sourceId, t_alloc: a.t_alloc, t_free: freed ? a.t_free : null });
    }).catch(function (err) {
      panel.innerHTML = "<p class='error-inline'>Allocation " + F.esc(id) + " could not be loaded: " + F.esc(err.message) + "</p>";
      NV.api.showError("allocation", err);
    });
  }

  return { show: show };
})();
