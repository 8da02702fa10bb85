// The engine page's small charts, drawn as SVG by hand (no library, nothing from another origin).
// Each chart keeps its last points in a ring buffer (the page's own memory: the server keeps no
// history) and shows them over the last minutes (five at most); window.llamactorCharts[name].data
// is that buffer, oldest first, one {t, <series key>: value, ...} per snapshot (t: ms since the
// epoch), for tests and for anyone reading the page from the console.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 320;
const HEIGHT = 90;
const TOP = 4;  // room above the highest point

export const WINDOW_S = 300;  // what a chart keeps: the last five minutes
const MIN_SPAN_S = 60;  // a young chart spans its points (at least a minute), not five mostly empty minutes

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  return node;
}

// A number short enough for a legend: 1234 -> "1.2k", 0.4567 -> "0.46".
export function short(value) {
  if (Math.abs(value) >= 1000) return `${(value / 1000).toFixed(1)}k`;
  return Number.isInteger(value) ? String(value) : value.toFixed(2).replace(/\.?0+$/, "");
}

// The y of each point's top: the value itself, or (stacked) its sum with the series before it.
function tops(points, series, stacked) {
  let below = points.map(() => 0);
  return series.map(({ key }) => {
    const ys = points.map((p, i) => (stacked ? below[i] : 0) + (p[key] || 0));
    below = ys;
    return ys;
  });
}

export class Chart {
  // node: an empty element; series: [{key, label, color}]; options: {max (a fixed top, e.g. 1 for
  // a ratio), stacked (areas on top of each other), format (value -> text)}.
  constructor(name, node, series, { max = null, stacked = false, format = short } = {}) {
    Object.assign(this, { name, series, max, stacked, format, data: [] });
    this.plot = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, preserveAspectRatio: "none",
      role: "img", "aria-label": node.dataset.title || name, class: "plot" });
    // stacked: filled areas without an outline (a series at zero would still draw its line on top)
    this.paths = series.map(({ color }) => this.plot.appendChild(svg(stacked ? "polygon" : "polyline",
      stacked ? { fill: color, "fill-opacity": 0.75, stroke: "none" }
        : { fill: "none", stroke: color, "stroke-width": 1.5, "vector-effect": "non-scaling-stroke" })));
    this.top = document.createElement("span");
    this.top.className = "top";
    this.legend = series.map(({ key, label, color }) => {
      const item = document.createElement("span");
      item.className = "series";
      item.dataset.series = key;
      item.style.setProperty("--color", color);
      item.textContent = `${label} –`;
      return item;
    });
    const legend = document.createElement("div");
    legend.className = "legend";
    legend.append(...this.legend, this.top);
    node.replaceChildren(legend, this.plot);
    node.dataset.chart = name;
  }

  // One snapshot's values (a {key: number} with at least the series' keys), at time t (ms).
  push(t, values) {
    const point = { t };
    for (const { key } of this.series) point[key] = Number(values[key]) || 0;
    this.data.push(point);
    while (this.data.length > 1 && this.data[0].t < t - WINDOW_S * 1000) this.data.shift();
    this.draw(t);
  }

  draw(now) {
    const ys = tops(this.data, this.series, this.stacked);
    const highest = this.max ?? Math.max(1e-9, ...ys.flat());
    const span = Math.min(WINDOW_S, Math.max(MIN_SPAN_S, (now - this.data[0].t) / 1000)) * 1000;
    const x = (t) => (WIDTH * (t - (now - span))) / span;
    const y = (v) => HEIGHT - ((HEIGHT - TOP) * v) / highest;
    ys.forEach((values, s) => {
      const line = this.data.map((p, i) => `${x(p.t).toFixed(1)},${y(values[i]).toFixed(1)}`);
      const base = this.stacked && s > 0 ? ys[s - 1] : null;
      const under = this.stacked ? this.data.map((p, i) => `${x(p.t).toFixed(1)},${y(base ? base[i] : 0).toFixed(1)}`)
        .reverse() : [];
      this.paths[s].setAttribute("points", [...line, ...under].join(" "));
    });
    const last = this.data[this.data.length - 1];
    this.series.forEach(({ key, label }, s) => { this.legend[s].textContent = `${label} ${this.format(last[key])}`; });
    this.top.textContent = `max ${this.format(this.max ?? highest)} · last ${span >= 120000 ? `${Math.round(span / 60000)} min`
      : `${Math.round(span / 1000)} s`}`;
    this.plot.dataset.points = String(this.data.length);
  }
}

// The tenants' shares of the engine now: one bar, a segment per tenant as wide as its running
// sequences (its waiting ones when none runs anywhere), the counts in the legend.
export class ShareBar {
  constructor(name, node) {
    Object.assign(this, { name, node, data: [] });
    this.bar = document.createElement("div");
    this.bar.className = "sharebar";
    this.legend = document.createElement("div");
    this.legend.className = "legend";
    node.replaceChildren(this.bar, this.legend);
    node.dataset.chart = name;
  }

  show(tenants, colors) {
    this.data = tenants.map((t) => ({ ...t }));
    const running = tenants.reduce((n, t) => n + t.running, 0);
    const weight = (t) => (running ? t.running : t.waiting);
    const total = tenants.reduce((n, t) => n + weight(t), 0) || 1;
    const color = (i) => colors[i % colors.length];
    this.bar.replaceChildren(...tenants.map((t, i) => {
      const part = document.createElement("div");
      part.dataset.tenant = t.name;
      part.title = `${t.name}: ${t.running} running, ${t.waiting} waiting`;
      part.style.width = `${(100 * weight(t)) / total}%`;
      part.style.background = color(i);
      return part;
    }));
    this.legend.replaceChildren(...(tenants.length ? tenants.map((t, i) => {
      const item = document.createElement("span");
      item.className = "series";
      item.style.setProperty("--color", color(i));
      item.textContent = `${t.name} ${t.running} running · ${t.waiting} waiting`;
      return item;
    }) : ["no tenant has a sequence running or waiting"]));
  }
}
