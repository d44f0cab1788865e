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
      if (r.segments) {
        box.insertAdjacentHTML("beforeend", "<h3>Host segments</h3>");
        NV.blockmap.render(appendDiv(box), r.segments.map(normalise), function () {});
      }
      var rest = {};
      Object.keys(r).forEach(function (k) { if (k !== "segments" && k !== "host") rest[k] = r[k]; });
      if (Object.keys(rest).length) generic(box, rest);
    }).catch(function (err) {
      loaded[sourceId] = false;
      box.innerHTML = "<p class='error-inline'>Pinned host memory could not be loaded: " + F.esc(err.message) + "</p>";
      NV.api.showError("host", err);
    });
  }

  function appendDiv(box) { var d = document.createElement("div"); box.appendChild(d); return d; }

  // Host segments may list blocks without offsets: lay them end to end.
  function normalise(seg) {
    var off = 0;
    var blocks = (seg.blocks || []).map(function (b) {
      var o = b.offset !== undefined ? b.offset : off;
      off = o + b.size;
      return { offset: o, size: b.size, state: b.state || (b.allocated ? "allocated" : "free"), alloc_id: b.alloc_id };
    });
    return { address: seg.address, size: seg.size || off, stream: seg.stream === undefined ? "–" : seg.stream,
             pool: seg.pool === undefined ? "host" : seg.pool, blocks: blocks };
  }

  // Everything else the server read, as a table: lists of records as rows, numbers of bytes in
  // binary units. Nothing is dropped because the page does not know its name.
  function generic(box, obj) {
    Object.keys(obj).forEach(function (k) {
      var v = obj[k], h = document.createElement("h3");
      h.textContent = k.replace(/_/g, " ");
      box.appendChild(h);
      if (Array.isArray(v) && v.length && typeof v[0] === "object") {
        var cols = Object.keys(v[0]), t = document.createElement("table");
        t.className = "generic";
        t.innerHTML = "<thead><tr>" + cols.map(function (c) { return "<th>" + F.esc(c) + "</th>"; }).join("") + "</tr></thead>";
        var body = document.createElement("tbody");
        v.slice(0, 500).forEach(function (row) {
          var tr = document.createElement("tr");
          tr.innerHTML = cols.map(function (c) { return "<td>" + F.esc(cell(c, row[c])) + "</td>"; }).join("");
          body.appendChild(tr);
        });
        t.appendChild(body); box.appendChild(t);
        if (v.length > 500) box.insertAdjacentHTML("beforeend", "<p class='muted'>the first 500 of " + F.count(v.length) + "</p>");
      } else {
        var p = document.createElement("p");
        p.textContent = typeof v === "object" ? JSON.stringify(v) : cell(k, v);
        box.appendChild(p);
      }
    });
  }

  function cell(key, v) {
    if (typeof v === "number" && /size|bytes|total/.test(key)) return F.bytes(v);
    if (typeof v === "number" && /addr/.test(key)) return F.hex(v);
    return v === null || v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v);
  }

  return { show: show };
})();
