// Talking to the local server: every request carries the page's token; every failure is shown
// in the page (the error list at the top), never swallowed.
"use strict";
var NV = window.NV || (window.NV = {});

NV.api = (function () {
  var token = new URLSearchParams(location.search).get("token") || "";

  function url(path, params) {
    var q = new URLSearchParams();
    Object.keys(params || {}).forEach(function (k) {
      if (params[k] !== undefined && params[k] !== null) q.set(k, params[k]);
    });
    var s = q.toString();
    return path + (s ? "?" + s : "");
  }

  // The server's error body is {"error": "..."} where it can say why; otherwise the status line.
  function failure(response, text) {
    var message = text;
    try { message = JSON.parse(text).error || text; } catch (e) { /* not JSON: keep the text */ }
    var err = new Error(response.status + " " + (message || response.statusText));
    err.status = response.status;
    return err;
  }

  function request(method, path, params, body, signal) {
    var init = { method: method, headers: { "X-Npumem-Token": token }, signal: signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(url(path, params), init).catch(function (err) {
      if (err.name === "AbortError") throw err;
      // fetch rejects only when nothing answered at all.
      throw new Error("the viewer's server does not answer (was npumem view stopped?)");
    }).then(function (r) {
      return r.text().then(function (text) {
        if (!r.ok) throw failure(r, text);
        try { return JSON.parse(text); } catch (e) {
          throw new Error(path + ": the server's answer is not JSON: " + text.slice(0, 200));
        }
      });
    });
  }

  function get(path, params, signal) { return request("GET", path, params, undefined, signal); }
  function post(path, body) { return request("POST", path, {}, body); }

  // Shown until dismissed; the same message is not listed twice.
  function showError(where, err) {
    if (err && err.name === "AbortError") return;     // a newer request replaced this one
    var list = document.getElementById("errors");
    var text = where + ": " + (err && err.message ? err.message : String(err));
    var items = list.querySelectorAll("li span");
    for (var i = 0; i < items.length; i++) if (items[i].textContent === text) return;
    var li = document.createElement("li");
    var span = document.createElement("span");
    span.textContent = text;
    var close = document.createElement("button");
    close.type = "button";
    close.textContent = "×";
    close.setAttribute("aria-label", "dismiss this error");
    close.onclick = function () { li.remove(); list.hidden = !list.children.length; };
    li.appendChild(span);
    li.appendChild(close);
    list.appendChild(li);
    list.hidden = false;
    if (window.console) console.error(text);
  }

  return { get: get, post: post, showError: showError, token: token };
})();
