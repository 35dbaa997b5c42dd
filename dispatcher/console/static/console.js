// dispatcher console: live refresh of the overview (counters and the 15-minute charts).
// Loaded from a file, never inline (the Content-Security-Policy forbids inline script); it
// writes only text and SVG attributes, never HTML.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
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

  function el(name, attrs) {
    var node = document.createElementNS(SVG, name);
    for (var key in attrs) { node.setAttribute(key, String(attrs[key])); }
    return node;
  }

  // points: [[seconds relative to the newest point, value], ...]; x spans the window
  function draw(svg, lines, windowS, unit) {
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var max = 0;
    lines.forEach(function (line) {
      line.points.forEach(function (p) { if (p[1] !== null && p[1] > max) { max = p[1]; } });
    });
    var top = max > 0 ? max * 1.1 : 1;
    lines.forEach(function (line) {
      var coords = [];
      line.points.forEach(function (p) {
        if (p[1] === null) { return; }
        var x = 600 * (1 + p[0] / windowS);
        var y = 150 - 140 * (p[1] / top);
        coords.push(x.toFixed(1) + "," + y.toFixed(1));
      });
      if (coords.length) {
        svg.appendChild(el("polyline", { "class": "series " + line.cls, points: coords.join(" ") }));
      }
    });
    var label = el("text", { x: 4, y: 12 });
    label.textContent = "max " + (Math.round(max * 100) / 100) + " " + unit;
    svg.appendChild(label);
    var left = el("text", { x: 4, y: 157 });
    left.textContent = Math.round(windowS / 60) + " min ago";
    svg.appendChild(left);
    var right = el("text", { x: 570, y: 157 });
    right.textContent = "now";
    svg.appendChild(right);
  }

  function last(points, index) {
    for (var i = points.length - 1; i >= 0; i--) {
      if (points[i][index] !== null) { return points[i][index]; }
    }
    return null;
  }

  function render(data) {
    setCells(data.queues || {});
    var pts = data.points || [];
    var starts = pts.map(function (p) { return [p[0], p[1]]; });
    var mean = pts.map(function (p) { return [p[0], p[2]]; });
    var p95 = pts.map(function (p) { return [p[0], p[3]]; });
    var s = document.getElementById("chart-starts");
    var l = document.getElementById("chart-latency");
    if (s) { draw(s, [{ points: starts, cls: "starts" }], data.window_s, "/s"); }
    if (l) { draw(l, [{ points: mean, cls: "mean" }, { points: p95, cls: "p95" }], data.window_s, "ms"); }
    var sn = document.getElementById("starts-now");
    var ln = document.getElementById("latency-now");
    if (sn) { sn.textContent = pts.length ? String(last(pts, 1)) + " now" : "no data yet"; }
    if (ln) {
      var m = last(pts, 2), q = last(pts, 3);
      ln.textContent = m === null ? "no start yet" : "mean " + m + ", p95 ≤ " + q;
    }
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
