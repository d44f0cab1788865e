// Leaks and steps, from the same leak analysis `npumem report` uses: the steps (marked by the
// program or inferred from the repeating pattern) and the lines whose memory grows step after step.
"use strict";
var NV = window.NV || (window.NV = {});

NV.leaks = (function () {
  var F = NV.fmt, loaded = {};

  function show(info, sourceId) {
    var panel = document.getElementById("panel-leaks");
    if (loaded[sourceId]) return;
    loaded[sourceId] = true;
    var box = document.createElement("div");
    box.className = "leaks-source";
    box.innerHTML = "<p class='muted'>Analysing…</p>";
    panel.appendChild(box);
    NV.api.get("/api/leaks", { source: sourceId }).then(function (r) {
      box.innerHTML = info.sources.length > 1 ? "<h3>" + String.fromCharCode(65 + sourceId) + ": " + F.esc(info.sources[sourceId].path) + "</h3>" : "";
      render(box, r, info.sources[sourceId]);
    }).catch(function (err) {
      loaded[sourceId] = false;
      box.innerHTML = "<p class='error-inline'>The leak analysis failed: " + F.esc(err.message) + "</p>";
      NV.api.showError("leaks", err);
    });
  }

  function render(box, r, src) {
    var leaks = r.leaks || [], steps = r.steps || [];
    var verdict = document.createElement("p");
    verdict.className = "leak-verdict";
    verdict.textContent = r.heading || r.verdict || r.summary ||
      (leaks.length ? leaks.length + " line" + (leaks.length > 1 ? "s" : "") + " grow step after step."
                    : steps.length > 1 ? "No line grows from step to step." : "Too few steps to tell a leak from a warm-up.");
    box.appendChild(verdict);
    if (leaks.length) {
      var t = document.createElement("table");
      t.className = "leaks";
      t.innerHTML = "<thead><tr><th>line</th><th class='num'>growth per step</th><th>evidence</th></tr></thead>";
      var body = document.createElement("tbody");
      leaks.forEach(function (l) {
        var tr = document.createElement("tr");
        var where = (l.file || "?") + ":" + (l.line === undefined ? "?" : l.line) + (l.name ? " " + l.name : "");
        tr.innerHTML = "<td><code></code></td><td class='num'></td><td></td>";
        tr.children[0].firstChild.textContent = where;
        tr.children[1].textContent = F.bytes(l.growth_per_step_bytes);
        tr.children[2].textContent = typeof l.evidence === "string" ? l.evidence : JSON.stringify(l.evidence);
        body.appendChild(tr);
      });
      t.appendChild(body);
      box.appendChild(t);
    }
    var h = document.createElement("h3");
    h.textContent = steps.length ? "Steps (" + steps.length + ")" : "No steps were marked or inferred.";
    box.appendChild(h);
    if (!steps.length) return;
    var ol = document.createElement("ol");
    ol.className = "steps";
    steps.forEach(function (s) {
      var li = document.createElement("li"), b = document.createElement("button");
      b.type = "button"; b.className = "link";
      var t = s.t !== undefined ? s.t : s.t0;
      b.textContent = (s.label || "step") + " at " + F.time(t - src.t_min, src.time_unit) + " · " + (s.source || "");
      var extra = Object.keys(s).filter(function (k) { return ["t", "t0", "label", "source"].indexOf(k) < 0; });
      if (extra.length) b.textContent += " · " + extra.map(function (k) {
        return k + " " + (/bytes/.test(k) ? F.bytes(s[k]) : s[k]);
      }).join(", ");
      b.title = "show this step on the timeline";
      b.onclick = function () { NV.app.showAround(src, t); };
      li.appendChild(b); ol.appendChild(li);
    });
    box.appendChild(ol);
  }

  return { show: show };
})();
