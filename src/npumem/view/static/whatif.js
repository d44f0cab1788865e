// What-if: replay a recording under another allocator setting through the server's model, with
// progress, and draw the reserved curve it gives over the recorded one, with tune's verdict.
"use strict";
var NV = window.NV || (window.NV = {});

NV.whatif = (function () {
  var F = NV.fmt, runs = 0, POLL_MS = 250;

  function init(info) {
    var pick = document.getElementById("whatif-pick"), text = document.getElementById("whatif-text");
    var sourceSel = document.getElementById("whatif-source"), help = document.getElementById("whatif-help");
    info.sources.forEach(function (s, i) {
      var o = document.createElement("option");
      o.value = String(i);
      o.textContent = (info.sources.length > 1 ? String.fromCharCode(65 + i) + ": " : "") + s.path;
      sourceSel.appendChild(o);
    });
    var none = document.createElement("option");
    none.value = ""; none.textContent = "— pick one, or type one —";
    pick.appendChild(none);
    (info.settings || []).forEach(function (s) {
      var o = document.createElement("option");
      o.value = s.value;                  // the text to POST; "" replays the settings recorded
      o.textContent = s.name;
      o.title = s.help || "";
      pick.appendChild(o);
    });
    pick.onchange = function () {
      text.value = pick.value;
      var s = (info.settings || [])[pick.selectedIndex - 1];
      help.textContent = s && s.help ? s.help : "";
    };
    document.getElementById("whatif-form").onsubmit = function (e) {
      e.preventDefault();
      var typed = text.value.trim();
      if (!typed && pick.selectedIndex < 1) { NV.api.showError("what-if", new Error("pick a setting or type one first")); return; }
      var setting = typed || pick.value;
      run(info, Number(sourceSel.value), setting);
    };
  }

  function run(info, sourceId, setting) {
    var colour = NV.draw.WHATIF[runs++ % NV.draw.WHATIF.length];
    var li = document.createElement("li");
    li.className = "whatif-run";
    li.innerHTML = "<span class='swatch' style='border-color:" + colour + "'></span> <code></code> " +
      "<progress max='1' value='0' aria-label='replay progress'></progress> <span class='state muted'>starting…</span>";
    li.querySelector("code").textContent = (setting || "(as recorded)") + (info.sources.length > 1 ? " on " + String.fromCharCode(65 + sourceId) : "");
    document.getElementById("whatif-runs").appendChild(li);
    var bar = li.querySelector("progress"), state = li.querySelector(".state");
    NV.api.post("/api/whatif", { source: sourceId, setting: setting }).then(function (r) {
      poll(info, r.job, sourceId, setting, colour, li, bar, state);
    }).catch(function (err) { fail(li, state, err); });
  }

  function poll(info, job, sourceId, setting, colour, li, bar, state) {
    NV.api.get("/api/job", { id: job }).then(function (j) {
      bar.value = Math.max(0, Math.min(1, j.progress || 0));
      state.textContent = Math.round(100 * bar.value) + "%";
      if (j.error) return fail(li, state, new Error(j.error));
      if (!j.done) { setTimeout(function () { poll(info, job, sourceId, setting, colour, li, bar, state); }, POLL_MS); return; }
      done(info, sourceId, setting, colour, li, bar, state, j.result);
    }).catch(function (err) { fail(li, state, err); });
  }

  function done(info, sourceId, setting, colour, li, bar, state, result) {
    bar.remove();
    var src = info.sources[sourceId];
    var recorded = result.recorded_peak_reserved || recordedPeak(sourceId);
    var entry = { source: sourceId, setting: setting || "(as recorded)", result: result, colour: colour, visible: true };
    state.className = "state";
    state.innerHTML = "peak reserved <strong>" + F.esc(F.bytes(result.peak_reserved)) + "</strong>" +
      (recorded ? " (recorded " + F.esc(F.bytes(recorded)) + ", " + delta(result.peak_reserved, recorded) + ")" : "") +
      " · <span class='verdict'></span> ";
    state.querySelector(".verdict").textContent = result.verdict || "";
    if (result.answer) {
      var answer = document.createElement("div");
      answer.className = "muted answer";
      answer.textContent = result.answer;
      state.appendChild(answer);
    }
    var toggle = document.createElement("label");
    toggle.innerHTML = "<input type='checkbox' checked> drawn";
    toggle.querySelector("input").onchange = function (e) { entry.visible = e.target.checked; NV.timeline.redraw(); NV.legend.update(); };
    state.insertBefore(toggle, state.querySelector(".answer"));
    li.setAttribute("data-done", "1");
    NV.timeline.addWhatif(entry);
    NV.legend.update();
    void src;
  }

  // The recorded peak from the overview (the whole recording at the overview's resolution keeps
  // each bucket's maximum, so its maximum is the recording's).
  function recordedPeak(sourceId) {
    var d = NV.timeline.state.overview[sourceId];
    if (!d || !d.reserved) return null;
    return Math.max.apply(null, d.reserved.max);
  }

  function delta(a, b) {
    var d = a - b;
    if (d === 0) return "the same";
    return (d < 0 ? "" : "+") + F.bytes(d) + ", " + (d < 0 ? "" : "+") + (100 * d / b).toFixed(1) + "%";
  }

  function fail(li, state, err) {
    var bar = li.querySelector("progress");
    if (bar) bar.remove();
    state.className = "state error-inline";
    state.textContent = "failed: " + err.message;
    li.setAttribute("data-done", "error");
    NV.api.showError("what-if", err);
  }

  return { init: init };
})();
