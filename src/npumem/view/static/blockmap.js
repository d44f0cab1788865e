// The live moment by segment: one row per segment (cudaMalloc'd or mapped range), with its
// blocks where they sit: allocated, free (cached, reusable) and inactive (split off but held
// back, e.g. waiting on another stream). The free pieces between blocks are what an OOM's
// "largest free block" is about. Click an allocated block to open the allocation.
"use strict";
var NV = window.NV || (window.NV = {});

NV.blockmap = (function () {
  var ROW = 18, GAP = 5, MAX_ROWS = 600;
  var FILL = { allocated: "#0072b2", free: "#ececec", inactive: "#e69f00" };

  function summary(segments) {
    var s = { reserved: 0, allocated: 0, free: 0, inactive: 0, pieces: 0, largestFree: 0 };
    segments.forEach(function (seg) {
      s.reserved += seg.size;
      seg.blocks.forEach(function (b) {
        s[b.state] = (s[b.state] || 0) + b.size;
        if (b.state === "free") { s.pieces++; s.largestFree = Math.max(s.largestFree, b.size); }
      });
    });
    return s;
  }

  function render(box, segments, onBlock) {
    box.innerHTML = "";
    segments = segments || [];
    if (!segments.length) {
      box.insertAdjacentHTML("beforeend", "<p class='muted'>No segments at this moment.</p>");
      return;
    }
    var F = NV.fmt, s = summary(segments);
    var p = document.createElement("p");
    p.className = "blockmap-summary";
    p.textContent = F.plural(segments.length, "segment") + ", " + F.bytes(s.reserved) + " reserved: " +
      F.bytes(s.allocated) + " allocated, " + F.bytes(s.free) + " free in " + F.plural(s.pieces, "piece") +
      " (largest " + F.bytes(s.largestFree) + ")" + (s.inactive ? ", " + F.bytes(s.inactive) + " inactive" : "") + ".";
    box.appendChild(p);
    var pools = {};
    segments.forEach(function (seg) { pools[pool(seg.pool) || "–"] = true; });
    if (Object.keys(pools).length === 1 && !pools["–"]) p.textContent += " All in the " + Object.keys(pools)[0] + ".";
    var legend = document.createElement("div");
    legend.className = "legend";
    legend.innerHTML = ["allocated", "free", "inactive"].map(function (k) {
      return "<span><i style='background:" + FILL[k] + "'></i>" + k + "</span>";
    }).join("");
    box.appendChild(legend);
    var shown = segments.slice(0, MAX_ROWS);
    if (segments.length > MAX_ROWS) {
      box.insertAdjacentHTML("beforeend", "<p class='muted'>The first " + MAX_ROWS + " of " +
        F.count(segments.length) + " segments are drawn.</p>");
    }
    var scroller = document.createElement("div");
    scroller.className = "blockmap-scroll";
    var canvas = document.createElement("canvas");
    canvas.className = "blockmap";
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", p.textContent + " Hover a block for its size; click an allocated one for its stack.");
    scroller.appendChild(canvas);
    box.appendChild(scroller);

    var g = NV.draw.fit(canvas, shown.length * (ROW + GAP) + GAP), ctx = g.ctx, w = g.w;
    var labels = shown.map(function (seg) {
      var p = pool(seg.pool);
      return F.hex(seg.address) + "  " + F.bytes(seg.size) + "  stream " + seg.stream +
        (p && p !== "default pool" ? "  " + p : "") +
        (seg.more_blocks ? "  +" + F.count(seg.more_blocks) + " blocks not listed" : "");
    });
    // The label column is as wide as the widest label, within reason.
    var LABEL = Math.min(Math.max.apply(null, labels.map(function (l) { return ctx.measureText(l).width; })) + 14,
                         Math.max(w * 0.45, 200));
    var barW = Math.max(w - LABEL - 8, 100), hits = [];
    shown.forEach(function (seg, i) {
      var y = GAP + i * (ROW + GAP), scale = barW / (seg.size || 1);
      ctx.fillStyle = "#222"; ctx.textBaseline = "middle"; ctx.textAlign = "left";
      ctx.save(); ctx.beginPath(); ctx.rect(0, y, LABEL - 6, ROW); ctx.clip();
      ctx.fillText(labels[i], 2, y + ROW / 2);
      ctx.restore();
      ctx.fillStyle = FILL.free;
      ctx.fillRect(LABEL, y, barW, ROW);
      seg.blocks.forEach(function (b) {
        var x = LABEL + b.offset * scale, bw = Math.max(b.size * scale, 1);
        ctx.fillStyle = FILL[b.state] || "#999";
        ctx.fillRect(x, y, bw, ROW);
        if (bw > 3) { ctx.fillStyle = "#fff"; ctx.fillRect(x + bw - 1, y, 1, ROW); }   // block edge
        hits.push({ x: x, w: bw, y: y, seg: seg, block: b });
      });
      ctx.strokeStyle = "#999"; ctx.strokeRect(LABEL + 0.5, y + 0.5, barW - 1, ROW - 1);
    });

    function at(e) {
      for (var i = 0; i < hits.length; i++) {
        var h = hits[i];
        if (e.offsetY >= h.y && e.offsetY < h.y + ROW && e.offsetX >= h.x && e.offsetX < h.x + Math.max(h.w, 2)) return h;
      }
      return null;
    }
    canvas.addEventListener("mousemove", function (e) {
      var h = at(e), tip = document.getElementById("tooltip");
      canvas.style.cursor = h && h.block.state === "allocated" ? "pointer" : "default";
      if (!h) { tip.hidden = true; return; }
      tip.innerHTML = "<strong>" + F.esc(h.block.state) + "</strong> " + F.bytes(h.block.size) +
        "<br>at " + F.hex(h.seg.address + h.block.offset) + " (offset " + F.bytes(h.block.offset) + ")" +
        (h.block.alloc_id !== null && h.block.alloc_id !== undefined ? "<br>allocation " + F.esc(h.block.alloc_id) + " · click for its stack" : "");
      tip.hidden = false;
      tip.style.left = (e.pageX + 14) + "px"; tip.style.top = (e.pageY + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { document.getElementById("tooltip").hidden = true; });
    canvas.addEventListener("click", function (e) {
      var h = at(e);
      if (h && h.block.state === "allocated" && h.block.alloc_id !== null && h.block.alloc_id !== undefined) onBlock(h.block.alloc_id);
    });
  }

  // PyTorch's MempoolId_t: (0, 0) is the default pools; another id is a private pool (CUDA
  // graphs, torch.cuda.MemPool).
  function pool(p) {
    if (p === null || p === undefined) return "";
    if (Array.isArray(p)) return p[0] === 0 && p[1] === 0 ? "default pool" : "pool (" + p.join(", ") + ")";
    return String(p);
  }

  // The largest allocated blocks, as a list of buttons: the keyboard's way to an allocation.
  // By size; where none of those has an allocation record (all live since before the trace),
  // the largest that have one follow, so there is always something a click can open.
  function largest(segments, count) {
    var all = [];
    (segments || []).forEach(function (seg) {
      seg.blocks.forEach(function (b) { if (b.state === "allocated") all.push({ seg: seg, block: b }); });
    });
    all.sort(function (a, b) { return b.block.size - a.block.size; });
    var top = all.slice(0, count);
    var known = function (x) { return x.block.alloc_id !== null && x.block.alloc_id !== undefined; };
    if (!top.some(known)) top = top.concat(all.slice(count).filter(known).slice(0, 5));
    return top;
  }

  return { render: render, largest: largest, summary: summary, pool: pool };
})();
