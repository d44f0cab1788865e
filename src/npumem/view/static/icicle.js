// The live bytes of a moment by the user's line: an icicle of stacks (the root, all live
// memory, on top; each row below splits its parent by the frame that allocated it). Click a box
// to make it the root; click the top row to go back up.
"use strict";
var NV = window.NV || (window.NV = {});

NV.icicle = (function () {
  var ROW = 20, MAX_DEPTH = 60;

  // Warm hues picked from the frame's file, so one file keeps one colour wherever it appears.
  function colour(name) {
    var file = String(name).split(":")[0], h = 0;
    for (var i = 0; i < file.length; i++) h = (h * 31 + file.charCodeAt(i)) >>> 0;
    return "hsl(" + (10 + h % 45) + ", " + (65 + h % 20) + "%, " + (62 + (h >> 5) % 14) + "%)";
  }

  function render(box, tree) {
    box.innerHTML = "";
    if (!tree || !tree.bytes) {
      box.insertAdjacentHTML("beforeend", "<p class='muted'>No stacks were recorded for the blocks live here.</p>");
      return;
    }
    var crumbs = document.createElement("div");
    crumbs.className = "crumbs";
    var canvas = document.createElement("canvas");
    canvas.className = "icicle";
    canvas.setAttribute("role", "img");
    box.appendChild(crumbs);
    box.appendChild(canvas);
    var path = [tree], boxes = [];

    function draw() {
      var root = path[path.length - 1];
      var w = canvas.clientWidth || box.clientWidth || 800;
      // Lay out first: the canvas is as tall as the deepest box wide enough to be drawn.
      boxes = [];
      (function lay(node, x0, x1, d) {
        if (x1 - x0 < 0.5 || d > MAX_DEPTH) return;
        boxes.push({ node: node, x: x0, w: x1 - x0, y: d * ROW });
        var x = x0, kids = (node.children || []).slice().sort(function (a, b) { return b.bytes - a.bytes; });
        kids.forEach(function (c) {
          var cw = (x1 - x0) * c.bytes / (node.bytes || 1);
          lay(c, x, x + cw, d + 1);
          x += cw;
        });
      })(root, 0, w, 0);
      var rows = 1 + Math.max.apply(null, boxes.map(function (b) { return b.y / ROW; }));
      var g = NV.draw.fit(canvas, rows * ROW + 2), ctx = g.ctx;
      canvas.setAttribute("aria-label", "Icicle of the stacks holding " + NV.fmt.bytes(root.bytes) +
        " under " + root.name + "; hover a box for its line and bytes, click to zoom into it");
      boxes.forEach(function (b) {
        ctx.fillStyle = b.node === root ? "#d9d9d9" : colour(b.node.name);
        ctx.fillRect(b.x, b.y, Math.max(b.w - 1, 0.5), ROW - 1);
        if (b.w > 40) {
          ctx.save();
          ctx.beginPath(); ctx.rect(b.x, b.y, b.w - 3, ROW); ctx.clip();
          ctx.fillStyle = "#111"; ctx.textBaseline = "middle";
          ctx.fillText(label(b.node), b.x + 4, b.y + ROW / 2);
          ctx.restore();
        }
      });
      crumbs.innerHTML = "";
      path.forEach(function (n, i) {
        var btn = document.createElement("button");
        btn.type = "button"; btn.className = "link";
        btn.textContent = (i ? short(n.name) : "all") + " (" + NV.fmt.bytes(n.bytes) + ")";
        btn.onclick = function () { path = path.slice(0, i + 1); draw(); };
        crumbs.appendChild(btn);
        if (i < path.length - 1) crumbs.appendChild(document.createTextNode(" › "));
      });
    }

    function at(e) {
      for (var i = boxes.length - 1; i >= 0; i--) {
        var b = boxes[i];
        if (e.offsetX >= b.x && e.offsetX < b.x + b.w && e.offsetY >= b.y && e.offsetY < b.y + ROW) return b;
      }
      return null;
    }
    canvas.addEventListener("mousemove", function (e) {
      var b = at(e), tip = document.getElementById("tooltip");
      if (!b) { tip.hidden = true; return; }
      var root = path[path.length - 1];
      tip.innerHTML = "<strong>" + NV.fmt.esc(b.node.name) + "</strong><br>" + NV.fmt.bytes(b.node.bytes) +
        " · " + (100 * b.node.bytes / (path[0].bytes || 1)).toFixed(1) + "% of live" +
        (root !== path[0] ? " · " + (100 * b.node.bytes / (root.bytes || 1)).toFixed(1) + "% of this view" : "");
      tip.hidden = false;
      tip.style.left = (e.pageX + 14) + "px"; tip.style.top = (e.pageY + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { document.getElementById("tooltip").hidden = true; });
    canvas.addEventListener("click", function (e) {
      var b = at(e);
      if (!b) return;
      var root = path[path.length - 1];
      if (b.node === root) { if (path.length > 1) path.pop(); }
      else {
        // Zoom to the box: keep the chain from the current root down to it as breadcrumbs.
        var chain = [];
        (function find(n, trail) {
          if (n === b.node) { chain = trail; return true; }
          return (n.children || []).some(function (c) { return find(c, trail.concat([c])); });
        })(root, []);
        path = path.concat(chain);
      }
      draw();
    });
    draw();
  }

  // A frame keeps its end (file:line and function); a note such as "(no Python stack: ...)"
  // keeps its start.
  function short(name) {
    var s = String(name);
    if (s.length <= 48) return s;
    return s.charAt(0) === "(" || s.indexOf("/") < 0 ? s.slice(0, 47) + "…" : "…" + s.slice(-47);
  }
  function label(n) { return short(n.name) + "  " + NV.fmt.bytes(n.bytes); }

  return { render: render };
})();
