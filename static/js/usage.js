// Usage pages: GPU-hours per day, stacked by user (a workspace) or by workspace (the
// platform), from the numbers the page embeds (drawn through charts.js); the month picker
// shows its month on change.
(function () {
  "use strict";

  function draw() {
    var div = document.getElementById("usage-chart");
    var data = document.getElementById("usage-chart-data");
    if (!div || !data || typeof Plotly === "undefined" || !window.tauCharts) return;
    var chart = JSON.parse(data.textContent);
    var traces = chart.series.map(function (series) {
      return { x: chart.days, y: series.gpu_hours, name: series.name, type: "bar" };
    });
    div.dataset.series = String(traces.length);
    window.tauCharts.draw(
      div,
      traces,
      {
        barmode: "stack",
        margin: { l: 50, r: 20, t: 20, b: 60 },
        height: 300,
        yaxis: { title: { text: "GPU-hours" }, rangemode: "tozero" },
        legend: { orientation: "h" },
      }
    );
  }

  function autosubmit() {
    document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
      select.addEventListener("change", function () {
        select.form.submit();
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    draw();
    autosubmit();
  });
})();
