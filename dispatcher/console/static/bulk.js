// dispatcher console: the job list's checkboxes. Loaded from a file, never inline (the
// Content-Security-Policy forbids inline script). Progressive enhancement only: without it the
// bulk form works the same, one checkbox at a time. It shows the "select every job on this
// page" box, keeps the ticked count, and never touches the rows themselves (a list refresh
// may replace them; the count is read again from the checkboxes each time).
(function () {
  "use strict";
  var form = document.getElementById("bulk-form");
  var all = document.getElementById("select-page");
  var shown = document.getElementById("selected-count");
  if (!form || !all || !shown) { return; }

  function boxes() {
    return document.querySelectorAll('input[type="checkbox"][name="id"][form="bulk-form"]');
  }

  function update() {
    var list = boxes();
    var ticked = 0;
    for (var i = 0; i < list.length; i++) { if (list[i].checked) { ticked++; } }
    shown.textContent = String(ticked);
    all.checked = list.length > 0 && ticked === list.length;
    all.indeterminate = ticked > 0 && ticked < list.length;
  }

  all.hidden = false;
  all.addEventListener("change", function () {
    var list = boxes();
    for (var i = 0; i < list.length; i++) { list[i].checked = all.checked; }
    update();
  });
  document.addEventListener("change", function (event) {
    var t = event.target;
    if (t && t.name === "id" && t.getAttribute("form") === "bulk-form") { update(); }
  });
  // live.js swapped the rows (keeping the ticks): count them again
  document.addEventListener("console:refreshed", update);
  update();
})();
