// dispatcher console: live pages. A page marks the parts that change with
// data-live-region="name"; while the tab is visible and live updates are not paused, this
// script fetches the same page again (with the session cookie) every few seconds and swaps
// each marked part for the fresh one, keeping what the operator was doing: ticked checkboxes
// (by name and value: job ids on the job list), the focused control, the scroll positions,
// a text selection (the swap waits), a field being typed into (the swap waits).
// Loaded from a file, never inline (the Content-Security-Policy forbids inline script); the
// fresh HTML is parsed by DOMParser, which runs no script, and comes from this origin only.
(function () {
  "use strict";
  var EVERY_MS = 5000;
  var STORE = "dispatcher.console.live";  // "paused" or absent, per browser (localStorage)
  var regions = document.querySelectorAll("[data-live-region]");
  var main = document.getElementById("main");
  if (!regions.length || !main || !window.fetch || !window.DOMParser) { return; }

  var timer = null;
  var inFlight = false;
  var lastGood = new Date();
  var served = {};  // region name -> the HTML the server sent last (unchanged: no swap)
  forEach(regions, function (r) { served[r.getAttribute("data-live-region")] = r.innerHTML; });

  // the control: a pause/resume button and a quiet status line, first in <main>
  var bar = document.createElement("p");
  bar.className = "live-bar";
  bar.id = "live-bar";
  var status = document.createElement("span");
  status.id = "live-status";
  var button = document.createElement("button");
  button.type = "button";
  button.id = "live-toggle";
  button.className = "link";
  bar.appendChild(status);
  bar.appendChild(document.createTextNode(" "));
  bar.appendChild(button);
  main.insertBefore(bar, main.firstChild);

  function forEach(list, fn) { for (var i = 0; i < list.length; i++) { fn(list[i], i); } }

  function stored() {
    try { return window.localStorage.getItem(STORE); } catch (e) { return null; }
  }

  function remember(paused) {
    try {
      if (paused) { window.localStorage.setItem(STORE, "paused"); }
      else { window.localStorage.removeItem(STORE); }
    } catch (e) { /* storage refused (private mode): the choice lasts for this page */ }
  }

  var paused = stored() === "paused";

  function clock(d) {
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  function show(state, note) {
    bar.setAttribute("data-state", state);
    button.textContent = paused ? "Resume live updates" : "Pause live updates";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    if (note) { status.textContent = note; return; }
    status.textContent = paused
      ? "Live updates paused; shown as of " + clock(lastGood) + "."
      : "Live: updated " + clock(lastGood) + ", every " + EVERY_MS / 1000 + " s.";
  }

  function stale(why) {
    bar.setAttribute("data-stale", "true");
    show("stale", "Stale since " + clock(lastGood) + (why ? " (" + why + ")" : "") + ".");
  }

  // what the operator is doing -----------------------------------------------------------
  function busy() {
    var active = document.activeElement;
    if (active && inRegion(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName) &&
        !/^(checkbox|radio|button|submit)$/.test(active.type)) {
      return true;  // typing into a field that a swap would replace
    }
    var sel = window.getSelection ? window.getSelection() : null;
    return !!(sel && !sel.isCollapsed && sel.anchorNode && inRegion(sel.anchorNode));
  }

  function inRegion(node) {
    var el = node.nodeType === 1 ? node : node.parentElement;
    return !!(el && el.closest && el.closest("[data-live-region]"));
  }

  // How an element is found again in the fresh part: its id, a control's name and value, a
  // link's address, else its position among the part's focusable elements.
  function identify(el, region) {
    if (el.id) { return { id: el.id }; }
    if (el.name) { return { name: el.name, value: el.value }; }
    if (el.getAttribute("href")) { return { href: el.getAttribute("href") }; }
    var all = region.querySelectorAll("a, button, input, select, textarea, [tabindex]");
    return { index: Array.prototype.indexOf.call(all, el) };
  }

  function find(key, region) {
    if (key.id) { return document.getElementById(key.id); }
    var found = null;
    if (key.name !== undefined) {
      forEach(region.querySelectorAll("[name]"), function (el) {
        if (!found && el.name === key.name && el.value === key.value) { found = el; }
      });
      return found;
    }
    if (key.href !== undefined) {
      forEach(region.querySelectorAll("a[href]"), function (el) {
        if (!found && el.getAttribute("href") === key.href) { found = el; }
      });
      return found;
    }
    var all = region.querySelectorAll("a, button, input, select, textarea, [tabindex]");
    return key.index >= 0 ? all[key.index] || null : null;
  }

  // what may be scrolled inside a part: the part itself, its table wrappers and <pre>s, found
  // again by their position among these (rows come and go inside them, not between them)
  function scrollers(region) {
    return [region].concat(Array.prototype.slice.call(region.querySelectorAll(".scroll, pre")));
  }

  // one swap ------------------------------------------------------------------------------
  function swap(region, fresh) {
    var ticks = {};  // checkbox and radio states by name=value (job ids on the job list)
    forEach(region.querySelectorAll("input[type=checkbox], input[type=radio]"), function (el) {
      ticks[(el.name || el.id) + "=" + el.value] = el.checked;
    });
    var active = document.activeElement;
    var focus = active && region.contains(active) ? identify(active, region) : null;
    var scrolled = scrollers(region).map(function (el) {
      return { top: el.scrollTop, left: el.scrollLeft };
    });
    region.innerHTML = fresh.innerHTML;  // parsed by DOMParser: inert until placed here
    forEach(region.querySelectorAll("input[type=checkbox], input[type=radio]"), function (el) {
      var was = ticks[(el.name || el.id) + "=" + el.value];
      if (was !== undefined) { el.checked = was; }
    });
    var now = scrollers(region);
    scrolled.forEach(function (s, i) {
      if (now[i] && (s.top || s.left)) { now[i].scrollTop = s.top; now[i].scrollLeft = s.left; }
    });
    if (focus) {
      var again = find(focus, region);
      if (again && again.focus) { again.focus({ preventScroll: true }); }
    }
  }

  function apply(doc) {
    var x = window.scrollX, y = window.scrollY;
    var changed = [];
    forEach(document.querySelectorAll("[data-live-region]"), function (region) {
      var name = region.getAttribute("data-live-region");
      var fresh = doc.querySelector('[data-live-region="' + name + '"]');
      if (!fresh || fresh.innerHTML === served[name]) { return; }
      served[name] = fresh.innerHTML;
      swap(region, fresh);
      changed.push(name);
    });
    if (window.scrollX !== x || window.scrollY !== y) { window.scrollTo(x, y); }
    if (changed.length) {
      // for other scripts of the page (e.g. a selection count): which parts were replaced
      document.dispatchEvent(new CustomEvent("console:refreshed", { detail: changed }));
    }
  }

  function refresh() {
    if (paused || document.hidden || inFlight) { return; }
    if (busy()) { return; }  // next tick: the operator is typing or selecting
    inFlight = true;
    var count = Number(bar.getAttribute("data-fetches") || "0") + 1;
    bar.setAttribute("data-fetches", String(count));
    fetch(window.location.pathname + window.location.search, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Accept": "text/html" },
    }).then(function (r) {
      if (r.redirected && /\/login/.test(r.url)) { throw new Error("signed out: reload"); }
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.text();
    }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, "text/html");
      if (!doc.querySelector("[data-live-region]")) { throw new Error("not this page"); }
      if (paused || document.hidden || busy()) { return; }  // changed while fetching
      apply(doc);
      lastGood = new Date();
      bar.removeAttribute("data-stale");
      show("live");
    }).catch(function (e) {
      stale(e && e.message && /^(HTTP|signed)/.test(e.message) ? e.message : "no answer");
    }).then(function () { inFlight = false; });
  }

  function start() {
    stop();
    if (paused || document.hidden) { show(paused ? "paused" : "hidden"); return; }
    if (bar.getAttribute("data-stale") !== "true") { show("live"); }
    timer = window.setInterval(refresh, EVERY_MS);
  }

  function stop() {
    if (timer !== null) { window.clearInterval(timer); timer = null; }
  }

  button.addEventListener("click", function () {
    paused = !paused;
    remember(paused);
    start();
    if (!paused) { refresh(); }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { stop(); bar.setAttribute("data-state", "hidden"); return; }
    start();
    refresh();  // back in view: catch up at once
  });
  window.addEventListener("pagehide", stop);
  window.addEventListener("pageshow", function (e) {
    if (e.persisted) { start(); refresh(); }  // back from the browser's page cache
  });
  start();
}());
