// The run page's live log and metric charts. Both poll only while the run is live and the
// tab is visible, and stop for good once the run has finished and everything is read.
(function () {
  "use strict";

  function visible() {
    return document.visibilityState === "visible";
  }

  // --- Log: the newest attempt followed live, or an older one read once ------------------
  function startLog() {
    var log = document.getElementById("log");
    if (!log) return;
    var logUrl = log.dataset.logUrl;
    var button = document.getElementById("log-follow");
    var picker = document.getElementById("log-attempt");
    var pickerForm = document.getElementById("log-attempt-form");
    var download = document.getElementById("log-download");
    // A run on a cluster has a log per pod: the picker appears when the attempt has several.
    var podPicker = document.getElementById("log-pod");
    var podField = document.getElementById("log-pod-field");
    var pod = null; // the pod picked, or null for the attempt's default (driver, worker 0)
    // Why there is no log yet (a pod that has not started, on Kubernetes), when the API says.
    var note = document.getElementById("log-note");
    var maxChars = 500000;
    var following = true;
    // The attempt picked, or null for the newest (followed while the run is live).
    var chosen = log.dataset.attempt ? parseInt(log.dataset.attempt, 10) : null;
    var attempt = null; // the attempt whose text is shown
    var offset = null; // null: start with the tail
    var ended = false; // the shown attempt is over and read to its end
    var done = false;
    var generation = 0; // a new choice drops answers that were meant for the previous one
    var timer = null;
    // Until an attempt writes something, the box says so in a quiet line (class log-waiting)
    // instead of standing empty and black.
    var placeholder = log.classList.contains("log-waiting");

    function showPlaceholder(chunk) {
      var text;
      if (chunk.attempt === null) text = "Nothing has started yet: the log appears here when the first attempt starts.";
      else if (chunk.complete) text = "Attempt " + chunk.attempt + " wrote nothing to its log.";
      else text = "No output from attempt " + chunk.attempt + " yet: it appears here as it is written.";
      placeholder = true;
      log.classList.add("log-waiting");
      if (log.textContent !== text) log.textContent = text;
    }

    function clearPlaceholder() {
      if (!placeholder) return;
      placeholder = false;
      log.classList.remove("log-waiting");
      log.textContent = "";
    }

    function runIsLive() {
      var runLive = document.getElementById("run-live");
      return Boolean(runLive && runLive.hasAttribute("data-poll-url"));
    }

    function newest() {
      return picker && picker.options.length ? parseInt(picker.options[0].value, 10) : null;
    }

    function showButton() {
      if (chosen !== null || done) {
        button.disabled = true;
        button.setAttribute("aria-pressed", "false");
        button.textContent = "Finished";
        return;
      }
      button.disabled = false;
      button.setAttribute("aria-pressed", String(following));
      button.textContent = following ? "Following" : "Paused";
    }

    function describe(number) {
      var which = (number ? "attempt " + number : "the first attempt") + (pod ? ", pod " + pod : "");
      log.setAttribute("aria-label", "Log of " + which);
      if (!download) return;
      download.href =
        logUrl + "?format=text" + (number ? "&attempt=" + number : "") + (pod ? "&pod=" + encodeURIComponent(pod) : "");
      var spoken = download.querySelector(".visually-hidden");
      if (spoken) spoken.textContent = " log" + (number ? " of attempt " + number : "") + (pod ? ", pod " + pod : "") + ", as text";
    }

    function showPods(pods, current) {
      if (!podPicker || !podField) return;
      if (!pods || pods.length < 2) {
        podField.hidden = true;
        return;
      }
      var have = Array.prototype.map.call(podPicker.options, function (option) {
        return option.value;
      });
      if (have.join("\n") !== pods.join("\n")) {
        podPicker.textContent = "";
        pods.forEach(function (name, index) {
          var option = document.createElement("option");
          option.value = name;
          option.textContent = index === 0 ? name + " (default)" : name;
          podPicker.appendChild(option);
        });
      }
      podPicker.value = current || pods[0];
      podField.hidden = false;
    }

    function restart() {
      generation += 1;
      if (timer !== null) window.clearTimeout(timer);
      timer = null;
      offset = null;
      ended = false;
      done = false;
      following = true;
      placeholder = false;
      log.classList.remove("log-waiting");
      log.textContent = "";
      showButton();
    }

    function addAttempt(number) {
      // An attempt that began after the page was drawn joins the picker as the newest.
      if (!picker) return;
      var known = newest();
      if (known !== null && number <= known) return;
      Array.prototype.forEach.call(picker.options, function (option) {
        option.textContent = "Attempt " + option.value;
      });
      var option = document.createElement("option");
      option.value = String(number);
      option.textContent = "Attempt " + number + " (newest)";
      picker.insertBefore(option, picker.firstChild);
      if (chosen === null) picker.value = option.value;
      if (pickerForm) pickerForm.hidden = false;
    }

    function append(text) {
      if (!text) return;
      clearPlaceholder();
      var atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
      log.textContent += text;
      if (log.textContent.length > maxChars) {
        log.textContent = "…\n" + log.textContent.slice(-maxChars);
      }
      if (chosen === null && following && atBottom) log.scrollTop = log.scrollHeight;
    }

    function later(delay) {
      timer = window.setTimeout(tick, delay);
    }

    function choose(number) {
      restart();
      chosen = number === null || number === newest() ? null : number;
      attempt = null;
      pod = null; // another attempt has other pods: start from its default
      showButton();
      describe(chosen === null ? newest() : chosen);
      var address = new URL(window.location.href);
      if (chosen === null) address.searchParams.delete("attempt");
      else address.searchParams.set("attempt", String(chosen));
      window.history.replaceState(window.history.state, "", address.toString());
      tick();
    }

    function tick() {
      timer = null;
      if (done || (chosen === null && !following)) return;
      if (!visible()) {
        later(2000);
        return;
      }
      var mine = generation;
      var query = offset === null ? "?tail=500" : "?offset=" + offset;
      // The newest is read from its own file until it ends; then asking for "the newest"
      // again shows whether a new attempt has begun.
      var target = chosen !== null ? chosen : ended ? null : attempt;
      if (target !== null) query += "&attempt=" + target;
      if (pod !== null) query += "&pod=" + encodeURIComponent(pod);
      fetch(logUrl + query, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (chunk) {
          if (mine !== generation) return;
          if (window.tauConnection) window.tauConnection(true);
          if (chosen === null && chunk.attempt !== null) addAttempt(chunk.attempt);
          if (chosen === null && attempt !== null && chunk.attempt !== null && chunk.attempt !== attempt) {
            // A new attempt began: show its log from its own start (or tail).
            attempt = null;
            offset = null;
            ended = false;
            pod = null;
            describe(chunk.attempt);
            later(0);
            return;
          }
          if ((offset === null || attempt === null) && chunk.attempt !== null) {
            // The first text of this attempt (which may be the first attempt there is).
            clearPlaceholder();
            log.textContent = chunk.offset > 0 ? "[the end of the log; Raw has all of it]\n" : "";
            if (chosen === null) describe(chunk.attempt);
          }
          if (chunk.attempt !== null) attempt = chunk.attempt;
          showPods(chunk.pods, chunk.pod);
          if (note) {
            note.textContent = chunk.note || "";
            note.hidden = !chunk.note;
          }
          append(chunk.text);
          if (!log.textContent || placeholder) showPlaceholder(chunk);
          offset = chunk.next_offset;
          var atEnd = chunk.next_offset >= chunk.size;
          if (chosen !== null) {
            // An older attempt is over: read it to its end once.
            if (atEnd) {
              done = true;
              return;
            }
            later(0);
            return;
          }
          ended = chunk.complete;
          var live = runIsLive();
          if (chunk.complete && !live) {
            done = true;
            showButton();
            return;
          }
          if (!live && chunk.attempt !== null && atEnd) {
            // One more read after the run ends, then stop.
            later(1000);
            return;
          }
          later(atEnd ? 2000 : 200);
        })
        .catch(function () {
          if (mine !== generation) return;
          if (window.tauConnection) window.tauConnection(false);
          later(5000);
        });
    }

    button.addEventListener("click", function () {
      following = !following;
      showButton();
      if (following) {
        log.scrollTop = log.scrollHeight;
        if (timer === null) tick();
      }
    });
    if (picker) {
      picker.addEventListener("change", function () {
        choose(parseInt(picker.value, 10));
      });
    }
    if (podPicker) {
      podPicker.addEventListener("change", function () {
        restart();
        pod = podPicker.selectedIndex > 0 ? podPicker.value : null;
        describe(chosen !== null ? chosen : attempt);
        tick();
      });
    }
    // The "log" links in the attempts list (redrawn by the live poll): switch in place.
    document.addEventListener("click", function (event) {
      var link = event.target.closest ? event.target.closest("a[data-log-attempt]") : null;
      if (!link || !picker) return;
      event.preventDefault();
      picker.value = link.dataset.logAttempt;
      choose(parseInt(link.dataset.logAttempt, 10));
      document.getElementById("log-heading").scrollIntoView();
      picker.focus();
    });
    showButton();
    tick();
  }

  // --- Metric charts ---------------------------------------------------------------------
  // Drawn through charts.js (the width of their container, names shown as plain text).
  var shownName = window.tauCharts.shownName;
  var plotlyText = window.tauCharts.plotlyText;

  function smooth(values, weight) {
    if (!weight) return values;
    var result = [];
    var last = null;
    values.forEach(function (value) {
      last = last === null ? value : last * weight + (1 - weight) * value;
      result.push(last);
    });
    return result;
  }

  function startMetrics() {
    var container = document.getElementById("metrics");
    if (!container || typeof Plotly === "undefined" || !window.tauCharts) return;
    var picker = document.getElementById("metric-picker");
    var slider = document.getElementById("metric-smoothing");
    var sliderValue = document.getElementById("metric-smoothing-value");
    var empty = document.getElementById("metrics-empty");
    var series = {};
    var chosen = null;
    var charts = {};

    function draw() {
      var keys = Object.keys(series).filter(function (key) {
        return chosen === null || chosen.indexOf(key) >= 0;
      });
      var weight = parseFloat(slider.value) || 0;
      // A sweep's trials report `trial-<n>/<metric>`: one chart per metric, a line per trial
      // (their curves overlaid); any other key is a chart of its own.
      var groups = {};
      var order = [];
      keys.forEach(function (key) {
        var trial = /^trial-(\d+)\/(.+)$/.exec(key);
        var group = trial ? "trials:" + trial[2] : key;
        if (!groups[group]) {
          groups[group] = { metric: trial ? trial[2] : key, trials: !!trial, keys: [] };
          order.push(group);
        }
        groups[group].keys.push({ key: key, trial: trial ? parseInt(trial[1], 10) : null });
      });
      order.forEach(function (group) {
        var entry = groups[group];
        var traces = [];
        entry.keys.sort(function (a, b) { return (a.trial || 0) - (b.trial || 0); });
        entry.keys.forEach(function (item) {
          var points = series[item.key];
          var x = points.map(function (p) { return p[0]; });
          var y = points.map(function (p) { return p[1]; });
          if (entry.trials) {
            traces.push({ x: x, y: smooth(y, weight), mode: "lines", name: "trial " + item.trial, line: { width: 2 } });
            return;
          }
          var name = plotlyText(item.key);
          traces.push({ x: x, y: y, mode: "lines", name: name, line: { color: "#9aa4f5", width: 1 } });
          if (weight) traces.push({ x: x, y: smooth(y, weight), mode: "lines", name: name + " (smoothed)", line: { color: "#2a3ab0", width: 2 } });
        });
        var title = entry.trials ? plotlyText(entry.metric) + " by trial" : plotlyText(entry.metric);
        var layout = {
          title: { text: title, font: { size: 14 } },
          margin: { l: 50, r: 20, t: 36, b: 40 },
          height: 260,
          xaxis: { title: { text: "step" } },
          showlegend: entry.trials,
          uirevision: group, // keep zoom and pan across updates
        };
        var div = charts[group];
        if (!div) {
          div = document.createElement("div");
          div.className = "chart";
          div.setAttribute("role", "figure");
          div.setAttribute(
            "aria-label",
            entry.trials ? "Chart of " + shownName(entry.metric) + " by step, one line per trial" : "Chart of " + shownName(entry.metric) + " by step"
          );
          container.appendChild(div);
          charts[group] = div;
        }
        window.tauCharts.draw(div, traces, layout);
      });
      Object.keys(charts).forEach(function (key) {
        if (order.indexOf(key) < 0) {
          window.tauCharts.purge(charts[key]);
          charts[key].remove();
          delete charts[key];
        }
      });
      if (empty) empty.hidden = Object.keys(series).length > 0;
    }

    function renderPicker(keys) {
      if (picker.dataset.keys === keys.join(",")) return;
      picker.dataset.keys = keys.join(",");
      picker.querySelectorAll("label").forEach(function (label) { label.remove(); });
      keys.forEach(function (key) {
        var label = document.createElement("label");
        var box = document.createElement("input");
        box.type = "checkbox";
        box.value = key;
        box.checked = chosen === null || chosen.indexOf(key) >= 0;
        box.addEventListener("change", function () {
          chosen = Array.prototype.filter.call(picker.querySelectorAll("input"), function (input) { return input.checked; }).map(function (input) { return input.value; });
          draw();
        });
        label.appendChild(box);
        label.appendChild(document.createTextNode(" " + shownName(key)));
        picker.appendChild(label);
      });
    }

    slider.addEventListener("input", function () {
      sliderValue.textContent = slider.value;
      draw();
    });

    function tick() {
      if (!visible()) {
        window.setTimeout(tick, 3000);
        return;
      }
      fetch(container.dataset.metricsUrl + "?max_points=1000", { credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (body) {
          series = body.series;
          renderPicker(body.keys);
          draw();
          var runLive = document.getElementById("run-live");
          if (runLive && runLive.hasAttribute("data-poll-url")) window.setTimeout(tick, 4000);
          else if (container.dataset.live === "true") {
            container.dataset.live = "false"; // one last read after the run ended
            window.setTimeout(tick, 1500);
          }
        })
        .catch(function () {
          window.setTimeout(tick, 8000);
        });
    }
    tick();
  }

  document.addEventListener("DOMContentLoaded", function () {
    startLog();
    startMetrics();
  });
})();
