// Live refresh for the console's queues overview and effects list (no
// build step). Every element with a data-live attribute and an id is
// replaced, every data-interval milliseconds, by the element of the same id
// in a fresh copy of the page, fetched with the page's own URL and cookie.
// Nothing else on the page is touched, so a form being typed into keeps
// its values. The toggle pauses and resumes; a refresh waits while the tab
// is hidden or while focus is inside a live region.
(function () {
  "use strict";
  var root = document.querySelector("[data-live-interval]");
  var toggle = document.getElementById("live-toggle");
  if (!root || !toggle) return;
  var interval = parseInt(root.getAttribute("data-live-interval"), 10);
  if (!(interval > 0)) return;
  var paused = sessionStorage.getItem("pgoutbox.live.paused") === "1";
  var timer = null, busy = false;

  function show() {
    root.setAttribute("data-live-state", paused ? "paused" : "live");
    toggle.textContent = paused ? "Resume live refresh" : "Pause live refresh";
    toggle.setAttribute("aria-pressed", paused ? "true" : "false");
  }

  function schedule() {
    clearTimeout(timer);
    if (!paused) timer = setTimeout(refresh, interval);
  }

  function refresh() {
    if (paused || busy) return;
    var focused = document.activeElement && document.activeElement.closest
      ? document.activeElement.closest("[data-live]") : null;
    if (document.hidden || focused) { schedule(); return; }
    busy = true;
    fetch(location.href, { credentials: "same-origin", headers: { "X-Pgoutbox-Live": "1" } })
      .then(function (resp) {
        if (!resp.ok || resp.redirected) throw new Error("HTTP " + resp.status);
        return resp.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (el) {
          var next = fresh.getElementById(el.id);
          if (next) el.replaceWith(document.importNode(next, true));
        });
        root.setAttribute("data-live-updated", new Date().toISOString());
        root.removeAttribute("data-live-error");
      })
      .catch(function (err) {
        root.setAttribute("data-live-error", String(err && err.message || err));
      })
      .then(function () { busy = false; schedule(); });
  }

  toggle.addEventListener("click", function () {
    paused = !paused;
    sessionStorage.setItem("pgoutbox.live.paused", paused ? "1" : "0");
    show();
    if (paused) clearTimeout(timer); else refresh();
  });
  toggle.hidden = false;
  show();
  schedule();
})();
