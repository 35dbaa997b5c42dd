// dispatcher console: live refresh of the overview's counters, and of the history charts on
// the overview and the queue page (drawn by the server as SVG: this fetches them again every
// 10 s while the page is visible and swaps them in).
// Loaded from a file, never inline (the Content-Security-Policy forbids inline script); the
// counters are written as text only; the charts come from this origin, parsed by DOMParser,
// which runs no script.
(function () {
  "use strict";
  var CHARTS_EVERY_MS = 10000;
  var section = document.getElementById("history");

  function refreshCharts() {
    if (document.hidden || !section || !window.DOMParser) { return; }
    fetch(section.getAttribute("data-chart-src"), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("history-charts");
        var old = document.getElementById("history-charts");
        if (fresh && old) { old.parentNode.replaceChild(document.importNode(fresh, true), old); }
      })
      .catch(function () { /* the next round tries again */ });
  }

  if (section) {
    var chartTimer = window.setInterval(refreshCharts, CHARTS_EVERY_MS);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) { refreshCharts(); } });
    window.addEventListener("pagehide", function () { window.clearInterval(chartTimer); });
  }

  var table = document.getElementById("queues");
  if (!table) { return; }
  var url = table.getAttribute("data-live");
  var timer = null;

  function setCells(queues) {
    var cells = table.querySelectorAll("td[data-q]");
    for (var i = 0; i < cells.length; i++) {
      var cell = cells[i];
      var queue = queues[cell.getAttribute("data-q")];
      if (!queue) { continue; }
      var value = queue[cell.getAttribute("data-f")];
      if (value === undefined) { continue; }
      // a count is a link to its list: keep the link, change its text
      (cell.firstElementChild || cell).textContent = String(value);
      if (cell.getAttribute("data-f") === "paused") {
        cell.className = value === "paused" ? "paused" : "";
      }
    }
  }

  function render(data) {
    setCells(data.queues || {});
  }

  function poll() {
    if (document.hidden) { return; }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) { render(data); } })
      .catch(function () { /* the next poll tries again */ });
  }

  poll();
  timer = window.setInterval(poll, 2000);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { poll(); } });
  window.addEventListener("pagehide", function () { window.clearInterval(timer); });
}());
