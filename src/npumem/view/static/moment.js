// A moment: what is live at the clicked time, by category, by the user's line (icicle), and by
// segment (block map), with the largest live blocks listed for the keyboard.
"use strict";
var NV = window.NV || (window.NV = {});

NV.moment = (function () {
  var F = NV.fmt, current = null, onAllocation = function () {};

  function section(panel, title) {
    var s = document.createElement("section");
    s.className = "sub";
    var h = document.createElement("h3");
    h.textContent = title;
    s.appendChild(h);
    panel.appendChild(s);
    var body = document.createElement("div");     // renderers clear their box: not the heading
    s.appendChild(body);
    return body;
  }

  function show(info, sourceId, t) {
    var panel = document.getElementById("panel-moment");
    var src = info.sources[sourceId];
    if (current) current.abort();
    current = new AbortController();
    panel.innerHTML = "<p class='muted'>Loading the moment at " + F.esc(F.time(t - src.t_min, src.time_unit)) + "…</p>";
    NV.api.get("/api/moment", { source: sourceId, t: t }, current.signal).then(function (m) {
      current = null;
      panel.innerHTML = "";
      panel.setAttribute("data-moment-t", String(m.t));
      var head = document.createElement("p");
      head.className = "moment-head";
      head.innerHTML = (info.sources.length > 1 ? "<strong>" + String.fromCharCode(65 + sourceId) + "</strong> · " : "") +
        "at <strong>" + F.esc(F.time(m.t - src.t_min, src.time_unit)) + "</strong> from the start" +
        (src.time_unit === "us" ? "" : "") + " · live <strong class='live-bytes'>" + F.esc(F.bytes(m.live_bytes)) + "</strong>" +
        (m.live_count !== undefined ? " in " + F.esc(F.plural(m.live_count, "block")) : "") +
        (m.entry !== undefined ? " <span class='muted'>(after entry " + F.esc(F.count(m.entry)) + ")</span>" : "");
      panel.appendChild(head);
      categories(section(panel, "By category"), m.by_category || [], m.live_bytes);
      NV.icicle.render(section(panel, "By line (icicle of stacks: click a box to zoom)"), m.flame);
      var segs = section(panel, "By segment");
      NV.blockmap.render(segs, m.segments, function (id) { onAllocation(sourceId, id); });
      largestList(section(panel, "Largest live blocks"), sourceId, m.segments);
    }).catch(function (err) {
      if (err.name === "AbortError") return;
      panel.innerHTML = "<p class='error-inline'>The moment could not be loaded: " + F.esc(err.message) + "</p>";
      NV.api.showError("moment", err);
    });
  }

  function categories(box, cats, live) {
    if (!cats.length) { box.insertAdjacentHTML("beforeend", "<p class='muted'>No categories recorded.</p>"); return; }
    var max = Math.max.apply(null, cats.map(function (c) { return c.bytes; })) || 1;
    var table = document.createElement("table");
    table.className = "bars";
    table.innerHTML = "<thead><tr><th>category</th><th class='num'>bytes</th><th class='num'>share</th><th></th></tr></thead>";
    var body = document.createElement("tbody");
    cats.slice().sort(function (a, b) { return b.bytes - a.bytes; }).forEach(function (c) {
      var tr = document.createElement("tr");
      var colour = NV.draw.categoryColour(indexOfCategory(c.name));
      tr.innerHTML = "<th>" + F.esc(c.name) + "</th><td class='num'>" + F.esc(F.bytes(c.bytes)) + "</td><td class='num'>" +
        (live ? (100 * c.bytes / live).toFixed(1) + "%" : "") + "</td><td class='bar-cell'><span class='bar' style='width:" +
        (100 * c.bytes / max).toFixed(1) + "%;background:" + colour + "'></span></td>";
      body.appendChild(tr);
    });
    table.appendChild(body);
    box.appendChild(table);
  }

  // The same colour as the category's band on the timeline.
  function indexOfCategory(name) {
    var all = NV.timeline.state.categories, i = all.indexOf(name);
    if (i < 0) { all.push(name); i = all.length - 1; }
    return i;
  }

  function largestList(box, sourceId, segments) {
    var top = NV.blockmap.largest(segments, 12);
    if (!top.length) { box.insertAdjacentHTML("beforeend", "<p class='muted'>Nothing allocated.</p>"); return; }
    var ol = document.createElement("ol");
    ol.className = "largest";
    top.forEach(function (x) {
      var li = document.createElement("li");
      var known = x.block.alloc_id !== null && x.block.alloc_id !== undefined;
      // A block live since before the trace began has no allocation record to open.
      var b = document.createElement(known ? "button" : "span");
      if (known) { b.type = "button"; b.className = "link"; b.setAttribute("data-alloc-id", String(x.block.alloc_id)); }
      b.textContent = F.bytes(x.block.size) + " at " + F.hex(x.seg.address + x.block.offset) + " (stream " + x.seg.stream +
        (NV.blockmap.pool(x.seg.pool) ? ", " + NV.blockmap.pool(x.seg.pool) : "") + ")";
      if (known) b.onclick = function () { onAllocation(sourceId, x.block.alloc_id); };
      else b.textContent += ": allocated before the trace began, no record";
      li.appendChild(b); ol.appendChild(li);
    });
    box.appendChild(ol);
  }

  function setAllocationHandler(f) { onAllocation = f; }

  return { show: show, setAllocationHandler: setAllocationHandler };
})();
