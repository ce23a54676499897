// Every Plotly chart of the portal is drawn through here (run, comparison, GPU and usage
// pages), so that each is laid out at the width its container has, whenever that is known.
//
// Plotly measures its container once, when it draws. A chart drawn into a container that
// has no width yet (hidden, not laid out) is drawn 700 px wide; a chart drawn before the
// charts after it join the same grid is drawn at the whole grid's width and then clipped
// when the grid makes room for them (the comparison page's first chart showed "los" and
// half its x-axis). So: a chart is drawn only once its container has a width, and redrawn
// at the new width whenever its container's size changes (a ResizeObserver sees a window
// resize, a grid that gains a column, a section that opens), not only on window resizes.
//
// Metric names come from the workload and are shown as plain text: Plotly reads HTML-like
// markup (<a href>, <b>, <br>) in titles and trace names, so those characters are escaped,
// and bidirectional and other invisible controls (a right-to-left override that reverses a
// name) are shown as their code instead of acting.
(function () {
  "use strict";

  var CONFIG = { displaylogo: false, responsive: false };
  var INVISIBLE = /[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;

  function shownName(key) {
    return key.replace(INVISIBLE, function (c) {
      return "[U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "]";
    });
  }

  function plotlyText(key) {
    return shownName(key).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  // The figure each chart should show: drawn when its container has a width.
  var figures = new Map();
  var observer = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(resized);

  function widthOf(div) {
    return div.clientWidth;
  }

  function render(div) {
    var figure = figures.get(div);
    if (!figure || typeof Plotly === "undefined") return;
    figure.drawnAt = widthOf(div);
    // No width in the layout: Plotly takes the container's, measured now that it has one.
    Plotly.react(div, figure.traces, figure.layout, figure.config);
  }

  function resized(entries) {
    entries.forEach(function (entry) {
      var div = entry.target;
      var figure = figures.get(div);
      if (!figure) return;
      var width = widthOf(div);
      if (width <= 0 || width === figure.drawnAt) return;
      if (figure.drawnAt === null) {
        render(div); // the first time it has a width
      } else {
        figure.drawnAt = width;
        Plotly.Plots.resize(div);
      }
    });
  }

  // Draw (or redraw with new data) ``traces`` in ``div``: now if it has a width, else as
  // soon as it gets one. Safe to call again and again, as live pages do.
  function draw(div, traces, layout, config) {
    forgetDetached();
    var known = figures.get(div);
    var figure = {
      traces: traces,
      layout: Object.assign({ autosize: true }, layout),
      config: Object.assign({}, CONFIG, config || {}, { responsive: false }),
      drawnAt: known ? known.drawnAt : null,
    };
    figures.set(div, figure);
    if (observer && !known) observer.observe(div);
    if (widthOf(div) > 0 || !observer) render(div);
  }

  // A live fragment swapped out takes its charts with it: stop watching them.
  function forgetDetached() {
    figures.forEach(function (_figure, div) {
      if (!div.isConnected) {
        if (observer) observer.unobserve(div);
        figures.delete(div);
      }
    });
  }

  function purge(div) {
    if (observer) observer.unobserve(div);
    figures.delete(div);
    if (typeof Plotly !== "undefined") Plotly.purge(div);
  }

  window.tauCharts = { draw: draw, purge: purge, shownName: shownName, plotlyText: plotlyText };
  // The name run.js and compare.js have always used for the metric names.
  window.tauMetricNames = { shownName: shownName, plotlyText: plotlyText };
})();
