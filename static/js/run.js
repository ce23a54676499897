// The run page's live log and metric charts. Both poll only while the run is live and the
// tab is visible, and stop for good once the run has finished and everything is read.
(function () {
  "use strict";

  function visible() {
    return document.visibilityState === "visible";
  }

  // --- Log tail with follow/pause ------------------------------------------------------
  function startLog() {
    var log = document.getElementById("log");
    if (!log) return;
    var button = document.getElementById("log-follow");
    var following = true;
    var offset = null;
    var attempt = null;
    var done = false;
    var maxChars = 500000;

    button.addEventListener("click", function () {
      following = !following;
      button.setAttribute("aria-pressed", String(following));
      button.textContent = following ? "Following" : "Paused";
      if (following) {
        log.scrollTop = log.scrollHeight;
        tick();
      }
    });

    function append(text) {
      if (!text) return;
      var atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
      log.textContent += text;
      if (log.textContent.length > maxChars) {
        log.textContent = "…\n" + log.textContent.slice(-maxChars);
      }
      if (following && atBottom !== false) log.scrollTop = log.scrollHeight;
    }

    function tick() {
      if (done || !following) return;
      if (!visible()) {
        window.setTimeout(tick, 2000);
        return;
      }
      var url = log.dataset.logUrl + (offset === null ? "?tail=500" : "?offset=" + offset + (attempt ? "&attempt=" + attempt : ""));
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (chunk) {
          if (window.tauConnection) window.tauConnection(true);
          if (chunk.attempt !== null && attempt !== null && chunk.attempt !== attempt) {
            // A new attempt began: start its log afresh.
            log.textContent = "";
          }
          if (offset === null) log.textContent = "";
          if (chunk.attempt !== null) attempt = chunk.attempt;
          append(chunk.text);
          offset = chunk.next_offset;
          var runLive = document.getElementById("run-live");
          var live = runLive && runLive.hasAttribute("data-poll-url");
          if (chunk.complete && !live) {
            done = true;
            button.disabled = true;
            button.textContent = "Finished";
            return;
          }
          if (!live && chunk.attempt !== null && chunk.next_offset >= chunk.size) {
            // One more read after the run ends, then stop.
            window.setTimeout(tick, 1000);
            return;
          }
          window.setTimeout(tick, chunk.next_offset < chunk.size ? 200 : 2000);
        })
        .catch(function () {
          if (window.tauConnection) window.tauConnection(false);
          window.setTimeout(tick, 5000);
        });
    }
    tick();
  }

  // --- Metric charts ---------------------------------------------------------------------
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
    if (!container || typeof Plotly === "undefined") return;
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
      keys.forEach(function (key) {
        var points = series[key];
        var x = points.map(function (p) { return p[0]; });
        var y = points.map(function (p) { return p[1]; });
        var traces = [{ x: x, y: y, mode: "lines", name: key, line: { color: "#9aa4f5", width: 1 } }];
        if (weight) traces.push({ x: x, y: smooth(y, weight), mode: "lines", name: key + " (smoothed)", line: { color: "#2a3ab0", width: 2 } });
        var layout = {
          title: { text: key, font: { size: 14 } },
          margin: { l: 50, r: 20, t: 36, b: 40 },
          height: 260,
          xaxis: { title: { text: "step" } },
          showlegend: false,
          uirevision: key, // keep zoom and pan across updates
        };
        var div = charts[key];
        if (!div) {
          div = document.createElement("div");
          div.className = "chart";
          div.setAttribute("role", "figure");
          div.setAttribute("aria-label", "Chart of " + key + " by step");
          container.appendChild(div);
          charts[key] = div;
        }
        Plotly.react(div, traces, layout, { displaylogo: false, responsive: true });
      });
      Object.keys(charts).forEach(function (key) {
        if (keys.indexOf(key) < 0) {
          Plotly.purge(charts[key]);
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
        label.appendChild(document.createTextNode(" " + key));
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
