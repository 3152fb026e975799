// Charts over uPlot (vendored). Each chart element records what it drew in data attributes
// (data-series, data-points, data-markers) and keeps the uPlot object as `el.uplot`, so
// tests and readers can check a chart without reading pixels.
"use strict";

const PALETTE = ["#2e5aac", "#c2410c", "#15803d", "#7e22ce", "#0e7490", "#a16207"];
const MARKER_COLORS = { move: "#1d2330", target: "#7e22ce", flag: "#b42318", recovery: "#067647" };

function withAlpha(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

// Vertical dashed lines with a short label: deployment moves, target changes, drift flags.
function markersPlugin(markers) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx, dpr = window.devicePixelRatio || 1;
        ctx.save();
        ctx.font = `${11 * dpr}px system-ui, sans-serif`;
        markers.forEach((m, i) => {
          const x = Math.round(u.valToPos(m.x, "x", true));
          if (x < u.bbox.left - 1 || x > u.bbox.left + u.bbox.width + 1) return;
          ctx.strokeStyle = ctx.fillStyle = MARKER_COLORS[m.kind] || "#1d2330";
          ctx.lineWidth = 1.5 * dpr;
          ctx.setLineDash([5 * dpr, 4 * dpr]);
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
          // Stagger labels so markers at nearly the same time stay readable; near the right
          // edge, write them to the left of their line.
          const label = m.short || "";
          const right = x + ctx.measureText(label).width + 6 * dpr > u.bbox.left + u.bbox.width;
          ctx.textAlign = right ? "right" : "left";
          ctx.fillText(label, x + (right ? -4 : 4) * dpr, u.bbox.top + (12 + 13 * (i % 6)) * dpr);
        });
        ctx.restore();
      }],
    },
  };
}

// Interval whiskers for categorical charts, where a band between categories would suggest
// values in between that do not exist.
function whiskersPlugin(series) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx, dpr = window.devicePixelRatio || 1;
        ctx.save();
        ctx.lineWidth = 2 * dpr;
        series.forEach((s, si) => {
          if (!s.lo || !s.hi) return;
          ctx.strokeStyle = PALETTE[si % PALETTE.length];
          u.data[0].forEach((xv, i) => {
            if (s.lo[i] === null || s.hi[i] === null) return;
            const x = Math.round(u.valToPos(xv, "x", true));
            const y0 = u.valToPos(s.lo[i], "y", true), y1 = u.valToPos(s.hi[i], "y", true);
            ctx.beginPath();
            ctx.moveTo(x, y0); ctx.lineTo(x, y1);
            ctx.moveTo(x - 5 * dpr, y0); ctx.lineTo(x + 5 * dpr, y0);
            ctx.moveTo(x - 5 * dpr, y1); ctx.lineTo(x + 5 * dpr, y1);
            ctx.stroke();
          });
        });
        ctx.restore();
      }],
    },
  };
}

function legend(el, series, markers) {
  const box = document.createElement("div");
  box.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = `swatch c${i % PALETTE.length}`;
    item.append(sw, s.label + (s.lo ? (s.whiskers ? " (95% interval)" : " (95% band)") : ""));
    box.append(item);
  });
  const kinds = [...new Set(markers.map((m) => m.kind))];
  const names = { move: "deployment move", target: "target change", flag: "drift flag", recovery: "recovery" };
  kinds.forEach((k) => {
    const item = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = `marker m-${k}`;
    item.append(sw, names[k] || k);
    box.append(item);
  });
  el.after(box);
}

// The padded x range of some values (time in seconds, or category indices).
function xRange(values, time) {
  const lo = Math.min(...values), hi = Math.max(...values);
  const pad = time ? Math.max((hi - lo) * 0.05, 3600) : 0.5;
  return [lo - pad, hi + pad];
}

// lineChart(el, {xs, series: [{label, ys, lo?, hi?, dash?, points?}], markers: [{x, kind, short}],
//                time: bool, y: {min, max, label}, xLabels?: [..], whiskers?: bool,
//                xRange?: [lo, hi]})
function lineChart(el, opts) {
  const { xs, series } = opts;
  const markers = opts.markers || [];
  el.dataset.series = String(series.length);
  el.dataset.points = String(xs.length);
  el.dataset.markers = String(markers.length);
  el.dataset.labels = series.map((s) => s.label).join("|");
  if (!xs.length && !markers.length) {
    el.classList.add("nodata");
    el.textContent = opts.empty || "no data";
    return null;
  }
  const data = [xs];
  const uSeries = [{}];
  const bands = [];
  series.forEach((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    const idx = data.length;
    data.push(s.ys);
    uSeries.push({
      label: s.label, stroke: color, width: 2, dash: s.dash, spanGaps: true,
      points: { show: true, size: 6, fill: color }, paths: s.points ? () => null : undefined,
    });
    if (s.lo && s.hi && !opts.whiskers) {
      data.push(s.lo, s.hi);
      uSeries.push({ label: `${s.label} low`, stroke: withAlpha(color, 0.25), width: 1, points: { show: false }, spanGaps: true });
      uSeries.push({ label: `${s.label} high`, stroke: withAlpha(color, 0.25), width: 1, points: { show: false }, spanGaps: true });
      bands.push({ series: [idx + 2, idx + 1], fill: withAlpha(color, 0.12) });
    }
  });
  let [lo, hi] = xRange(xs.concat(markers.map((m) => m.x)), opts.time);
  if (opts.xRange) [lo, hi] = opts.xRange; // charts that share a time axis
  const y = opts.y || {};
  const axes = [
    opts.xLabels
      ? { values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? opts.xLabels[t] ?? "" : "")), space: 40 }
      : {},
    { label: y.label || "", size: 50 },
  ];
  if (opts.xLabels) axes[0].splits = () => opts.xLabels.map((_, i) => i);
  const u = new uPlot({
    width: Math.max(el.clientWidth, 320),
    height: opts.height || 260,
    scales: {
      x: { time: !!opts.time, range: () => [lo, hi] },
      y: { range: () => [y.min ?? 0, y.max ?? 1] },
    },
    series: uSeries,
    bands,
    axes,
    legend: { show: false },
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"), // tables show UTC too
    cursor: { drag: { x: false, y: false } },
    plugins: [markersPlugin(markers), ...(opts.whiskers ? [whiskersPlugin(series)] : [])],
  }, data, el);
  el.uplot = u;
  legend(el, series.map((s) => ({ ...s, whiskers: !!opts.whiskers })), markers);
  window.addEventListener("resize", () => u.setSize({ width: Math.max(el.clientWidth, 320), height: u.height }));
  return u;
}

window.pairregCharts = { lineChart, xRange };
