// TauGrid portal behaviour that works alongside htmx, with no inline scripts (the CSP
// forbids them): live fragments that poll only while visible, and confirmations.
(function () {
  "use strict";

  // --- Live fragments -----------------------------------------------------------------
  // An element with data-poll-url is re-fetched every data-poll-interval ms while the tab is
  // visible. The server sends the fragment's ETag; when nothing changed it answers 304 and
  // nothing is swapped. A fragment that is no longer live comes back without data-poll-url,
  // which ends its polling.
  var timers = new Map();

  function schedule(element) {
    if (timers.has(element)) return;
    var interval = parseInt(element.dataset.pollInterval || "3000", 10);
    var timer = window.setTimeout(function () {
      timers.delete(element);
      poll(element);
    }, interval);
    timers.set(element, timer);
  }

  function poll(element) {
    if (!document.body.contains(element) || !element.dataset.pollUrl) return;
    if (document.visibilityState !== "visible") {
      schedule(element);
      return;
    }
    var headers = { "HX-Request": "true" };
    if (element.dataset.etag) headers["If-None-Match"] = element.dataset.etag;
    fetch(element.dataset.pollUrl, { headers: headers, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 304) return null;
        if (!response.ok) throw new Error("HTTP " + response.status);
        var redirect = response.headers.get("HX-Redirect");
        if (redirect) {
          window.location.assign(redirect);
          return null;
        }
        return response.text();
      })
      .then(function (html) {
        connection(true);
        if (html !== null && html !== undefined) {
          htmx.swap(element, html, { swapStyle: "outerHTML" });
          scan(document);
        } else {
          schedule(element);
        }
      })
      .catch(function () {
        connection(false);
        // A network hiccup: try again later, a little less often.
        element.dataset.pollInterval = String(Math.min(30000, parseInt(element.dataset.pollInterval || "3000", 10) * 2));
        schedule(element);
      });
  }

  // Say so when live updates stop arriving, and stop saying it when they resume.
  function connection(ok) {
    var banner = document.getElementById("live-status");
    if (banner) banner.hidden = ok;
  }
  window.tauConnection = connection;

  function scan(root) {
    root.querySelectorAll("[data-poll-url]").forEach(schedule);
  }

  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") {
      // Catch up at once when the tab comes back.
      timers.forEach(function (timer, element) {
        window.clearTimeout(timer);
        timers.delete(element);
        poll(element);
      });
    }
  });

  // --- Confirmations --------------------------------------------------------------------
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    scan(document);
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    scan(event.target);
  });
})();
