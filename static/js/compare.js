// The comparison page's metric charts: for every metric either run reported, one chart with
// both runs' curves over each other (A and B in fixed colours). Read once: a comparison is
// of what the runs reported when the page was opened. Drawn through charts.js, as every
// chart: at the width of its place in the grid, names shown as plain text.
(function () {
  "use strict";

  var COLOURS = { a: "#2a3ab0", b: "#d9480f" };

  function read(url) {
    return fetch(url + "?max_points=1000", { credentials: "same-origin", cache: "no-store" }).then(
      function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      }
    );
  }

  function draw(container, bodies) {
    var names = window.tauCharts;
    var drawings = [];
    var keys = {};
    bodies.forEach(function (body) {
      Object.keys(body.series).forEach(function (key) { keys[key] = true; });
    });
    var sorted = Object.keys(keys).sort();
    var empty = document.getElementById("compare-metrics-empty");
    if (empty) empty.hidden = sorted.length > 0;
    sorted.forEach(function (key) {
      var traces = [];
      ["a", "b"].forEach(function (side, index) {
        var points = bodies[index].series[key];
        if (!points) return;
        traces.push({
          x: points.map(function (p) { return p[0]; }),
          y: points.map(function (p) { return p[1]; }),
          mode: "lines",
          name: names.plotlyText(container.dataset[side + "Name"]),
          line: { color: COLOURS[side], width: 2 },
        });
      });
      var div = document.createElement("div");
      div.className = "chart compare-chart";
      div.setAttribute("role", "figure");
      div.setAttribute("aria-label", "Chart of " + names.shownName(key) + " by step, both runs");
      div.dataset.metric = key;
      div.dataset.traces = String(traces.length);
      container.appendChild(div);
      drawings.push([
        div,
        traces,
        {
          title: { text: names.plotlyText(key), font: { size: 14 } },
          margin: { l: 50, r: 20, t: 36, b: 40 },
          height: 280,
          xaxis: { title: { text: "step" } },
          showlegend: true,
          legend: { orientation: "h" },
        },
      ]);
    });
    // Every chart is in its place before any is drawn: each is drawn at its own width.
    drawings.forEach(function (drawing) {
      names.draw(drawing[0], drawing[1], drawing[2]);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var container = document.getElementById("compare-metrics");
    if (!container || typeof Plotly === "undefined" || !window.tauCharts) return;
    Promise.all([read(container.dataset.aUrl), read(container.dataset.bUrl)])
      .then(function (bodies) { draw(container, bodies); })
      .catch(function () {
        var empty = document.getElementById("compare-metrics-empty");
        if (empty) empty.textContent = "The metrics could not be read; reload the page to try again.";
      });
  });
})();
