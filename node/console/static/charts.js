// Draws a page's charts with uPlot (static/vendor/uplot) from the JSON the
// page embeds beside each one (<script type="application/json">, which the
// page's Content-Security-Policy lets through as it is never run). The
// page's tables say the same without JavaScript; without uPlot, nothing is
// drawn.
(function () {
  if (typeof uPlot === "undefined") {
    return;
  }
  var lines = ["#157f3b", "#b42318", "#9a6700"];
  document.querySelectorAll(".chart[data-chart]").forEach(function (el) {
    var src = document.getElementById(el.dataset.chart);
    if (!src) {
      return;
    }
    var d = JSON.parse(src.textContent);
    if (!d.at || d.at.length === 0) {
      el.textContent = "Nothing to draw yet.";
      return;
    }
    var bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.7, 40] }) : null;
    var series = [{}];
    var data = [d.at];
    var hasMs = false;
    var line = 0;
    d.series.forEach(function (s) {
      var one = { label: s.label, scale: s.unit };
      if (s.unit === "ms") {
        hasMs = true;
        one.stroke = lines[line++ % lines.length];
        one.width = 2;
        one.value = function (u, v) { return v == null ? "–" : v.toFixed(2) + " ms"; };
      } else {
        one.stroke = "#2f5bd3";
        one.fill = "rgba(47, 91, 211, 0.3)";
        one.points = { show: false };
        if (s.bars && bars) {
          one.paths = bars;
        }
      }
      series.push(one);
      data.push(s.values);
    });
    var axes = [{}, { scale: "events", label: "events" }];
    if (hasMs) {
      axes.push({ scale: "ms", side: 1, label: "ms", grid: { show: false } });
    }
    var size = function () { return { width: Math.max(260, el.clientWidth), height: 220 }; };
    var s = size();
    var u = new uPlot({ width: s.width, height: s.height, series: series, axes: axes, scales: { x: { time: true } } }, data, el);
    window.addEventListener("resize", function () { u.setSize(size()); });
  });
})();
