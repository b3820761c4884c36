/* The console's two charts, drawn with the vendored Chart.js from the JSON the page carries. */
(function () {
  "use strict";
  var COLORS = {
    system: "#5b6cff", tools: "#9b59b6", summary: "#16a085", history: "#2e86de",
    media: "#e67e22", reasoning: "#c0392b", reserve: "#95a5a6", margin: "#cfd6dd", free: "#eef2f5"
  };

  function data(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  /* Vertical lines at given values of the x axis: the trigger and the urgent line. */
  var markers = {
    id: "markers",
    afterDatasetsDraw: function (chart, _args, options) {
      var ctx = chart.ctx, area = chart.chartArea, scale = chart.scales.x;
      (options.lines || []).forEach(function (line) {
        var x = scale.getPixelForValue(line.value);
        ctx.save();
        ctx.strokeStyle = line.color;
        ctx.lineWidth = 2;
        ctx.setLineDash(line.dash || []);
        ctx.beginPath();
        ctx.moveTo(x, area.top - 4);
        ctx.lineTo(x, area.bottom + 4);
        ctx.stroke();
        ctx.fillStyle = line.color;
        ctx.font = "11px sans-serif";
        ctx.textAlign = x > area.right - 60 ? "right" : "left";
        var y = line.below ? area.bottom + 14 : area.top - 6;
        ctx.fillText(line.label, x + (ctx.textAlign === "left" ? 4 : -4), y);
        ctx.restore();
      });
    }
  };

  function drawBar() {
    var bar = data("bar-data");
    var canvas = document.getElementById("bar");
    if (!bar || !canvas) return;
    var datasets = bar.segments.map(function (name, i) {
      return { label: name, data: [bar.tokens[i]], backgroundColor: COLORS[name] || "#888",
               borderWidth: 0, barPercentage: 1, categoryPercentage: 1 };
    });
    new Chart(canvas, {
      type: "bar",
      data: { labels: ["next request"], datasets: datasets },
      options: {
        indexAxis: "y", responsive: true, maintainAspectRatio: false, animation: false,
        layout: { padding: { top: 18, bottom: 16 } },
        scales: {
          x: { stacked: true, min: 0, max: Math.max(bar.window, bar.tokens.reduce(function (a, b) { return a + b; }, 0)) },
          y: { stacked: true, display: false }
        },
        plugins: {
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          tooltip: { callbacks: { label: function (c) { return c.dataset.label + ": " + c.raw.toLocaleString(); } } },
          markers: { lines: [
            { value: bar.trigger_at, color: "#d35400", label: "trigger", dash: [6, 3] },
            { value: bar.urgent_at, color: "#c0392b", label: "urgent", below: true }
          ] }
        }
      },
      plugins: [markers]
    });
  }

  function drawTurns() {
    var turns = data("turns-data");
    var canvas = document.getElementById("turns");
    if (!turns || !canvas) return;
    var points = function (ys) { return turns.x.map(function (x, i) { return { x: x, y: ys[i] }; }); };
    new Chart(canvas, {
      type: "line",
      data: { datasets: [
        { label: "without Recap (the whole history)", data: points(turns.without), borderColor: "#95a5a6", pointRadius: 0, borderWidth: 2 },
        { label: "with Recap (what was sent then)", data: points(turns["with"]), borderColor: "#2e86de", pointRadius: 0, borderWidth: 2 },
        { label: "provider reported", data: turns.measured, borderColor: "#16a085", backgroundColor: "#16a085", showLine: false, pointRadius: 3 },
        { label: "next request", data: [turns.now], borderColor: "#d35400", backgroundColor: "#d35400", showLine: false, pointRadius: 5, pointStyle: "rectRot" },
        { label: "window", data: [{ x: 1, y: turns.window }, { x: turns.now.x, y: turns.window }], borderColor: "#c0392b", borderDash: [6, 3], pointRadius: 0, borderWidth: 1 }
      ] },
      options: {
        responsive: true, maintainAspectRatio: false, animation: false, parsing: true,
        scales: {
          x: { type: "linear", title: { display: true, text: "message on the branch" } },
          y: { beginAtZero: true, title: { display: true, text: "provider tokens" } }
        },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } }
      }
    });
  }

  drawBar();
  drawTurns();
})();
