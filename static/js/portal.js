// TauGrid portal behaviour that works alongside htmx, with no inline scripts (the CSP
// forbids them): live fragments that poll only while visible, times relative to now that
// stay true, messages that go when their news is old, and confirmations.
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
          liveChanged();
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

  // --- Times relative to now -------------------------------------------------------------
  // "12 seconds ago" is true when the page is drawn. A page left open (whose live parts
  // answer 304 while nothing changes) keeps it true here, in the words Django's naturaltime
  // uses, for every <time datetime=… data-relative>.
  var NBSP = "\u00a0";
  var UNITS = [
    [365 * 86400, "year"],
    [30 * 86400, "month"],
    [7 * 86400, "week"],
    [86400, "day"],
    [3600, "hour"],
    [60, "minute"],
  ];

  function count(number, unit) {
    return number + NBSP + unit + (number === 1 ? "" : "s");
  }

  function since(seconds) {
    // Django's timesince: the largest unit, and the next one down when it is not zero.
    for (var i = 0; i < UNITS.length; i += 1) {
      var first = Math.floor(seconds / UNITS[i][0]);
      if (first > 0) {
        var text = count(first, UNITS[i][1]);
        if (i + 1 < UNITS.length) {
          var second = Math.floor((seconds - first * UNITS[i][0]) / UNITS[i + 1][0]);
          if (second > 0) text += ", " + count(second, UNITS[i + 1][1]);
        }
        return text;
      }
    }
    return count(0, "minute");
  }

  function relative(then, now) {
    var seconds = Math.floor((now - then) / 1000);
    var future = seconds < 0;
    // A clock a little behind the server's is no reason to say "from now".
    if (future && seconds > -60) seconds = 0;
    seconds = Math.abs(seconds);
    if (seconds === 0) return "now";
    var text;
    if (seconds < 60) text = seconds === 1 ? "a second" : seconds + " seconds";
    else if (seconds < 3600) {
      var minutes = Math.floor(seconds / 60);
      text = minutes === 1 ? "a minute" : minutes + " minutes";
    } else if (seconds < 86400) {
      var hours = Math.floor(seconds / 3600);
      text = hours === 1 ? "an hour" : hours + " hours";
    } else text = since(seconds);
    return text + (future ? " from now" : " ago");
  }

  function refreshTimes() {
    var now = Date.now();
    document.querySelectorAll("time[data-relative][datetime]").forEach(function (element) {
      var then = Date.parse(element.getAttribute("datetime"));
      if (isNaN(then)) return;
      var text = relative(then, now);
      if (element.textContent !== text) element.textContent = text;
    });
  }

  // --- Messages ---------------------------------------------------------------------------
  // What an action just did ("Submitted run-x.") is news for a moment: once a live part of
  // the page changes, the page itself shows what happened since and the note goes (but not
  // before it could be read: READ_SECONDS); it goes after NEWS_SECONDS anyway. Warnings and
  // errors stay until dismissed; any can be.
  var NEWS_SECONDS = 12;
  var READ_SECONDS = 4;

  function isNews(message) {
    return message.classList.contains("message-success") || message.classList.contains("message-info");
  }

  function dismiss(message) {
    var list = message.parentNode;
    message.remove();
    if (list && !list.querySelector(".message")) {
      var box = list.parentNode && list.parentNode.getAttribute("role") === "status" ? list.parentNode : list;
      box.remove();
    }
  }

  function setUpMessages() {
    document.querySelectorAll(".messages .message").forEach(function (message) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = "message-dismiss";
      button.setAttribute("aria-label", "Dismiss this message");
      button.textContent = "\u00d7";
      button.addEventListener("click", function () {
        dismiss(message);
      });
      message.appendChild(button);
      message.dataset.shownAt = String(Date.now());
      if (isNews(message)) {
        window.setTimeout(function () {
          dismiss(message);
        }, NEWS_SECONDS * 1000);
      }
    });
  }

  function liveChanged() {
    document.querySelectorAll(".messages .message").forEach(function (message) {
      if (!isNews(message)) return;
      var left = parseInt(message.dataset.shownAt || "0", 10) + READ_SECONDS * 1000 - Date.now();
      window.setTimeout(function () {
        if (message.isConnected) dismiss(message);
      }, Math.max(0, left));
    });
  }

  // --- Menus --------------------------------------------------------------------------------
  // A top-bar menu (<details class="menu">) closes when another opens, on a click elsewhere,
  // and on Escape (focus back on its button).
  document.addEventListener("click", function (event) {
    document.querySelectorAll("details.menu[open]").forEach(function (menu) {
      if (!menu.contains(event.target)) menu.open = false;
    });
  });
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") return;
    document.querySelectorAll("details.menu[open]").forEach(function (menu) {
      menu.open = false;
      var summary = menu.querySelector("summary");
      if (summary && menu.contains(document.activeElement)) summary.focus();
    });
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
    setUpMessages();
    refreshTimes();
    window.setInterval(refreshTimes, 5000);
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    scan(event.target);
  });
})();
