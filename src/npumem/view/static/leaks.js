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

  // The answer is the report's: its heading, the steps it judged over (live bytes at each
  // step against the first), the lines that grow, and the report's own lines of text.
  function render(box, r, src) {
    var steps = r.steps || {}, growing = r.growing || [], sites = r.sites || [];
    var verdict = document.createElement("p");
    verdict.className = "leak-verdict";
    verdict.textContent = r.heading || (growing.length ? growing.length + " line(s) grow step after step."
                                                        : "No line grows step after step.");
    box.appendChild(verdict);
    var how = document.createElement("p");
    how.className = "muted";
    how.textContent = "Steps: " + (steps.describe || "none") +
      (steps.source ? " (" + steps.source + ")" : "");
    box.appendChild(how);

    if (growing.length) {
      box.appendChild(heading("Growing, step after step"));
      box.appendChild(table(["line", "growth per step", "live now", "evidence"], growing.map(function (l) {
        return [{ code: l.where || ((l.file || "?") + ":" + (l.line === undefined ? "?" : l.line)) },
                { num: F.bytes(l.growth_per_step_bytes) },
                { num: l.live_bytes !== undefined ? F.bytes(l.live_bytes) : "–" },
                l.describe || (typeof l.evidence === "string" ? l.evidence : JSON.stringify(l.evidence || ""))];
      }), "leaks"));
    }
    if (!growing.length && !sites.length) box.insertAdjacentHTML("beforeend", "<p>none</p>");
    if (sites.length) {
      box.appendChild(heading("What the report lists under its leak heading"));
      box.appendChild(table(["where", "allocations", "bytes"], sites.map(function (s) {
        return [{ code: s.where }, { num: F.count(s.count) }, { num: F.bytes(s.bytes) }];
      }), "leaks"));
      if (r.more_sites) box.insertAdjacentHTML("beforeend", "<p class='muted'>and " + F.count(r.more_sites) + " more</p>");
    }
    var ts = steps.t || [];
    box.appendChild(heading(ts.length ? "Steps (" + F.count(ts.length) + ")" : "No steps were marked or inferred."));
    if (ts.length) {
      var growth = steps.growth || [];
      box.appendChild(table(["step", "starts at", "live bytes against the first step"], ts.map(function (t, i) {
        var link = document.createElement("button");
        link.type = "button"; link.className = "link";
        link.textContent = F.time(t - src.t_min, src.time_unit);
        link.title = "show this step on the timeline";
        link.onclick = function () { NV.app.showAround(src, t); };
        return [String(i), { node: link }, { num: growth[i] === undefined ? "–" : (growth[i] > 0 ? "+" : "") + F.bytes(growth[i]) }];
      }).slice(0, 500), "steps-table"));
    }
    if (r.lines && r.lines.length) {
      var details = document.createElement("details");
      details.innerHTML = "<summary>The analysis in the report's words</summary><pre class='report-lines'></pre>";
      details.querySelector("pre").textContent = r.lines.join("\n");
      box.appendChild(details);
    }
  }

  function heading(text) { var h = document.createElement("h3"); h.textContent = text; return h; }

  // Cells: a string, {num}, {code} or {node}.
  function table(head, rows, cls) {
    var t = document.createElement("table");
    t.className = cls;
    t.innerHTML = "<thead><tr>" + head.map(function (h, i) {
      return "<th" + (i && typeof rows[0][i] === "object" && rows[0][i].num !== undefined ? " class='num'" : "") + ">" + F.esc(h) + "</th>";
    }).join("") + "</tr></thead>";
    var body = document.createElement("tbody");
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      row.forEach(function (cell) {
        var td = document.createElement("td");
        if (cell && cell.node) td.appendChild(cell.node);
        else if (cell && cell.code !== undefined) { var c = document.createElement("code"); c.textContent = cell.code; td.appendChild(c); }
        else if (cell && cell.num !== undefined) { td.className = "num"; td.textContent = cell.num; }
        else td.textContent = cell;
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    t.appendChild(body);
    return t;
  }

  return { show: show };
})();
