// Small inline-SVG charts for the kprof tab: no library, no network, they scale to the page width.

const NS = 'http://www.w3.org/2000/svg';

/** Drawing width in px: the page's content width, so chart text keeps the page's font size. */
function pageWidth() {
  return Math.max(480, Math.min(document.documentElement.clientWidth - 40, 1240));
}

/** An SVG element with attributes and children (text children become text nodes). */
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function frame(width, height, label) {
  return svg('svg', {viewBox: `0 0 ${width} ${height}`, class: 'chart', role: 'img', 'aria-label': label});
}

/** Shortest readable number: 3 significant digits, no exponent for the ranges we plot. */
export function num(value) {
  const abs = Math.abs(value);
  if (abs === 0) return '0';
  if (abs >= 100) return value.toFixed(0);
  if (abs >= 10) return value.toFixed(1);
  if (abs >= 1) return value.toFixed(2);
  return value.toFixed(3);
}

/** Median of a list of numbers. */
export function median(values) {
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/** The value below which a share `q` (0..1) of `values` lies (nearest rank). */
export function quantile(values, q) {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

/**
 * Step time over a run: `points` is [[step, ms], ...] in step order. The y axis starts at 0; a dashed
 * line marks the median. Steps slower than 4x the 90th percentile (the first step, a checkpoint) would
 * flatten everything else, so the axis stops there and each of them is drawn at the top, labelled with
 * its real time.
 */
export function lineChart(points, unit = 'ms') {
  const width = pageWidth(), height = 170, left = 76, right = 12, top = 16, bottom = 24;
  const chart = frame(width, height, `step time over ${points.length} steps`);
  const steps = points.map((p) => p[0]);
  const values = points.map((p) => p[1]);
  const x0 = Math.min(...steps), x1 = Math.max(...steps);
  const cap = 4 * quantile(values, 0.9);
  const max = Math.max(...values);
  const yMax = (max > cap ? cap : max * 1.05) || 1;
  const x = (s) => left + (x1 === x0 ? 0.5 : (s - x0) / (x1 - x0)) * (width - left - right);
  const y = (v) => top + (1 - Math.min(v, yMax) / yMax) * (height - top - bottom);
  const mid = median(values);
  for (const v of [0, yMax / 2, yMax]) {
    chart.append(svg('line', {x1: left, x2: width - right, y1: y(v), y2: y(v), class: 'grid'}));
    chart.append(svg('text', {x: left - 6, y: y(v) + 4, class: 'tick', 'text-anchor': 'end'}, `${num(v)} ${unit}`));
  }
  const ends = x1 === x0 ? [[x0, 'middle']] : [[x0, 'start'], [x1, 'end']];
  for (const [s, anchor] of ends) {
    chart.append(svg('text', {x: x(s), y: height - 6, class: 'tick', 'text-anchor': anchor}, `step ${s}`));
  }
  chart.append(svg('line', {x1: left, x2: width - right, y1: y(mid), y2: y(mid), class: 'median'}));
  chart.append(svg('text', {x: left + 4, y: y(mid) - 4, class: 'tick'}, `median ${num(mid)} ${unit}`));
  if (points.length === 1) {
    chart.append(svg('circle', {cx: x(steps[0]), cy: y(values[0]), r: 3, class: 'dot'}));
  } else {
    chart.append(svg('polyline', {points: points.map(([s, v]) => `${x(s)},${y(v)}`).join(' '), class: 'line'}));
  }
  for (const [s, v] of points.filter((p) => p[1] > yMax)) {
    chart.append(svg('circle', {cx: x(s), cy: y(v), r: 3, class: 'dot'}, svg('title', {}, `step ${s}: ${num(v)} ${unit}`)));
    chart.append(svg('text', {x: x(s) + 5, y: top - 4 + 8, class: 'tick'}, `${num(v)} ${unit} (step ${s})`));
  }
  return chart;
}

/**
 * One horizontal stacked bar per row: `rows` are {label, parts: [{value, cls, name}]}; all bars share
 * one scale so longer steps draw longer bars. Hovering a segment shows its name and value.
 */
export function stackedBars(rows, unit = 'ms') {
  const bar = 14, gap = 6, left = 92, right = 70;
  const height = rows.length * (bar + gap) + gap;
  const width = pageWidth();
  const chart = frame(width, height, `breakdown of ${rows.length} steps`);
  const total = (row) => row.parts.reduce((sum, p) => sum + p.value, 0);
  const max = Math.max(...rows.map(total)) || 1;
  const scale = (width - left - right) / max;
  rows.forEach((row, i) => {
    const y = gap + i * (bar + gap);
    chart.append(svg('text', {x: left - 6, y: y + bar - 3, class: 'tick', 'text-anchor': 'end'}, row.label));
    let x = left;
    for (const part of row.parts) {
      if (part.value <= 0) continue;
      const w = part.value * scale;
      chart.append(svg('rect', {x, y, width: w, height: bar, class: part.cls},
        svg('title', {}, `${row.label}: ${part.name} ${num(part.value)} ${unit}`)));
      x += w;
    }
    chart.append(svg('text', {x: x + 5, y: y + bar - 3, class: 'tick'}, `${num(total(row))} ${unit}`));
  });
  return chart;
}

/**
 * Variants side by side: a bar to each median with a whisker from p10 to p90. `items` are
 * {label, median, low, high, cls}; items without a median are left out.
 */
export function rangeBars(items, unit = 'ms') {
  const shown = items.filter((it) => it.median !== null && it.median !== undefined);
  const bar = 16, gap = 8, left = 120, right = 90;
  const height = shown.length * (bar + gap) + gap;
  const width = pageWidth();
  const chart = frame(width, height, `median step time of ${shown.length} variants`);
  const max = Math.max(...shown.map((it) => it.high ?? it.median)) || 1;
  const scale = (width - left - right) / max;
  shown.forEach((it, i) => {
    const y = gap + i * (bar + gap);
    const mid = y + bar / 2;
    chart.append(svg('text', {x: left - 6, y: mid + 4, class: 'tick', 'text-anchor': 'end'}, it.label));
    chart.append(svg('rect', {x: left, y, width: it.median * scale, height: bar, class: it.cls},
      svg('title', {}, `${it.label}: median ${num(it.median)} ${unit}`)));
    if (it.low !== null && it.high !== null) {
      chart.append(svg('line', {x1: left + it.low * scale, x2: left + it.high * scale, y1: mid, y2: mid, class: 'whisker'}));
      for (const v of [it.low, it.high]) {
        chart.append(svg('line', {x1: left + v * scale, x2: left + v * scale, y1: y + 3, y2: y + bar - 3, class: 'whisker'}));
      }
    }
    const end = left + Math.max(it.median, it.high ?? 0) * scale;
    chart.append(svg('text', {x: end + 6, y: mid + 4, class: 'tick'}, `${num(it.median)} ${unit}`));
  });
  return chart;
}
