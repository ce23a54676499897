// GPU charts: a node's GPUs over time (the fleet's node page), a workspace's GPUs held over
// time against its quota, and a run's GPU utilisation over its life. Charts read JSON and
// poll only while the tab is visible, with the ETag the server gives (304: nothing to redraw);
// they are drawn through charts.js, at the width of their place on the page.
(function () {
  "use strict";

  var TITLES = {
    utilization: ["Utilisation", "%"],
    memory_used_mib: ["Memory used", "GiB"],
    temperature_c: ["Temperature", "°C"],
    power_w: ["Power", "W"],
  };

  function visible() {
    return document.visibilityState === "visible";
  }

  // Fetch JSON with the ETag of the last answer; resolve to null when nothing changed.
  function reader(url) {
    var etag = null;
    return function () {
      var headers = {};
      if (etag) headers["If-None-Match"] = etag;
      return fetch(url(), { headers: headers, credentials: "same-origin", cache: "no-store" }).then(
        function (response) {
          if (response.status === 304) return null;
          if (!response.ok) throw new Error("HTTP " + response.status);
          etag = response.headers.get("ETag");
          return response.json();
        }
      );
    };
  }

  // Run ``tick`` now and every ``interval`` ms while the tab is visible (at once when it
  // comes back), until ``tick`` answers false.
  function every(interval, tick) {
    var timer = null;
    function next() {
      timer = window.setTimeout(run, interval);
    }
    function run() {
      timer = null;
      if (!visible()) return;
      Promise.resolve(tick()).then(
        function (again) {
          if (again !== false) next();
        },
        function () {
          if (window.tauConnection) window.tauConnection(false);
          next();
        }
      );
    }
    document.addEventListener("visibilitychange", function () {
      if (visible() && timer === null) run();
    });
    run();
  }

  function chartDiv(container, key, label) {
    var div = container.querySelector('[data-chart="' + key + '"]');
    if (!div) {
      div = document.createElement("div");
      div.className = "chart";
      div.dataset.chart = key;
      div.setAttribute("role", "figure");
      div.setAttribute("aria-label", label);
      container.appendChild(div);
    }
    return div;
  }

  // --- A node's GPUs ------------------------------------------------------------------------
  function startNodeCharts() {
    var container = document.getElementById("gpu-charts");
    if (!container || typeof Plotly === "undefined" || !window.tauCharts) return;
    var note = document.getElementById("gpu-charts-note");
    var picker = document.getElementById("chart-window");
    var windowName = container.dataset.window;
    var read = reader(function () {
      return container.dataset.chartsUrl + "?window=" + encodeURIComponent(windowName);
    });

    function draw(body) {
      if (note) {
        note.hidden = !body.notice && body.charts.length > 0;
        if (body.notice) note.textContent = body.notice;
      }
      body.charts.forEach(function (chart) {
        var title = TITLES[chart.field] || [chart.field, ""];
        var gib = chart.field === "memory_used_mib";
        var traces = Object.keys(chart.series).map(function (name) {
          var points = chart.series[name];
          return {
            x: points.map(function (p) { return p[0]; }),
            y: points.map(function (p) { return gib ? p[1] / 1024 : p[1]; }),
            mode: "lines",
            name: name,
            line: { width: 1.5 },
          };
        });
        window.tauCharts.draw(
          chartDiv(container, chart.field, title[0] + " of each GPU over the last " + windowName),
          traces,
          {
            title: { text: title[0] + " (" + title[1] + ")", font: { size: 14 } },
            margin: { l: 50, r: 20, t: 36, b: 40 },
            height: 240,
            showlegend: traces.length > 1,
            legend: { orientation: "h" },
            yaxis: chart.field === "utilization" ? { range: [0, 100] } : {},
            uirevision: chart.field + windowName,
          }
        );
      });
    }

    if (picker) {
      picker.addEventListener("change", function () {
        windowName = picker.value;
        var address = new URL(window.location.href);
        address.searchParams.set("window", windowName);
        window.history.replaceState(null, "", address);
        read = reader(function () {
          return container.dataset.chartsUrl + "?window=" + encodeURIComponent(windowName);
        });
        read().then(function (body) { if (body) draw(body); });
      });
    }
    every(parseInt(container.dataset.pollInterval || "15000", 10), function () {
      return read().then(function (body) {
        if (window.tauConnection) window.tauConnection(true);
        if (body) draw(body);
      });
    });
  }

  // --- A workspace's GPUs held over time ----------------------------------------------------
  function startUsageChart() {
    var div = document.getElementById("gpu-usage-chart");
    if (!div || typeof Plotly === "undefined" || !window.tauCharts) return;
    var picker = document.getElementById("chart-window");
    var windowName = div.dataset.window;

    function load() {
      return fetch(div.dataset.usageUrl + "?window=" + encodeURIComponent(windowName), {
        credentials: "same-origin",
        cache: "no-store",
      })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (body) {
          var traces = body.runs.map(function (run) {
            return { x: body.times, y: run.gpus, name: run.run, mode: "lines", stackgroup: "held", line: { width: 0.5, shape: "hv" } };
          });
          traces.push({ x: body.times, y: body.times.map(function () { return body.quota; }), name: "quota", mode: "lines", line: { color: "#c92a2a", width: 2, dash: "dash" } });
          if (body.ceiling !== null) {
            traces.push({ x: body.times, y: body.times.map(function () { return body.ceiling; }), name: "with borrowing", mode: "lines", line: { color: "#868e96", width: 1, dash: "dot" } });
          }
          div.dataset.runs = String(body.runs.length);
          window.tauCharts.draw(
            div,
            traces,
            {
              margin: { l: 50, r: 20, t: 20, b: 40 },
              height: 300,
              yaxis: { title: { text: "GPUs" }, rangemode: "tozero" },
              legend: { orientation: "h" },
              uirevision: windowName,
            }
          );
        });
    }

    if (picker) {
      picker.addEventListener("change", function () {
        windowName = picker.value;
        var address = new URL(window.location.href);
        address.searchParams.set("window", windowName);
        window.history.replaceState(null, "", address);
        load();
      });
    }
    every(parseInt(div.dataset.pollInterval || "60000", 10), load);
  }

  // --- A run's GPUs over its life (the run page's GPU section, swapped in by the poller) ---
  function drawRunChart() {
    var div = document.getElementById("run-gpu-chart");
    var data = document.getElementById("run-gpu-series");
    if (!div || !data || typeof Plotly === "undefined" || !window.tauCharts) return;
    var points = JSON.parse(data.textContent);
    window.tauCharts.draw(
      div,
      [{ x: points.map(function (p) { return p[0]; }), y: points.map(function (p) { return p[1]; }), mode: "lines", name: "average of its GPUs", line: { color: "#2a3ab0", width: 2 } }],
      {
        title: { text: "Utilisation of its GPUs (%)", font: { size: 14 } },
        margin: { l: 50, r: 20, t: 36, b: 40 },
        height: 220,
        yaxis: { range: [0, 100] },
        showlegend: false,
        uirevision: "run-gpus",
      }
    );
  }

  document.addEventListener("DOMContentLoaded", function () {
    startNodeCharts();
    startUsageChart();
    drawRunChart();
  });
  document.addEventListener("htmx:afterSettle", drawRunChart);
})();
