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
  for (const child of children.flat(Infinity)) {
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

/** The tick step (1, 2 or 5 x 10^k) that puts about `count` ticks across `span`. */
export function tickStep(span, count = 8) {
  const raw = span / count;
  const base = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * base).find((s) => s >= raw);
}

/** Labels at the wanted heights `ys`, moved apart so that none is closer than `gap` px to the next. */
function spread(ys, gap) {
  const order = ys.map((y, i) => i).sort((a, b) => ys[a] - ys[b]);
  const out = [...ys];
  order.forEach((i, k) => {
    if (k > 0) out[i] = Math.max(out[i], out[order[k - 1]] + gap);
  });
  return out;
}

/** The colour of kprof's own cost (kprof/profiler_ms) wherever the tab draws it. */
export const PROFILER_COLOR = '#9c755f';

/**
 * Step time over a run: `points` is [[step, ms], ...] in step order, each step without kprof's own cost, which
 * `profiler` ([[step, ms], ...]) holds: it is drawn as a band on top of the line, so the band's top edge is the
 * wall time (step + profiler). The y axis starts at 0. Shaded bands mark
 * `windows` ([[first, last], ...]: the profiled steps), red dots the `slow` steps (step numbers). Dashed lines
 * mark the median of every step and, when there are windows, of the profiled steps; their labels sit in the
 * right margin, outside the plot, so they never cover the line. Steps slower than 4x the 90th percentile (the
 * first step, a checkpoint) would flatten everything else, so the axis stops there and each of them is drawn
 * as a triangle at the top, its real time in its tooltip.
 */
export function lineChart(points, {windows = [], slow = [], profiler = [], unit = 'ms'} = {}) {
  const width = pageWidth(), height = 190, left = 76, right = 190, top = 22, bottom = 24;
  const chart = frame(width, height, `step time over ${points.length} steps`);
  const steps = points.map((p) => p[0]);
  const values = points.map((p) => p[1]);
  const own = new Map(profiler);
  const walls = points.map(([s, v]) => v + (own.get(s) || 0));
  const x0 = Math.min(...steps), x1 = Math.max(...steps);
  const cap = 4 * quantile(walls, 0.9);
  const max = Math.max(...walls);
  const yMax = (max > cap ? cap : max * 1.05) || 1;
  const x = (s) => left + (x1 === x0 ? 0.5 : (s - x0) / (x1 - x0)) * (width - left - right);
  const y = (v) => top + (1 - Math.min(v, yMax) / yMax) * (height - top - bottom);
  const half = x1 === x0 ? 4 : (width - left - right) / (x1 - x0) / 2;
  let lastLabel = -Infinity;
  for (const [first, last] of windows) {
    const a = x(first) - half, b = x(last) + half;
    chart.append(svg('rect', {x: a, y: top, width: b - a, height: height - top - bottom, class: 'window'},
      svg('title', {}, `profiled: step ${first}${last > first ? `–${last}` : ''}`)));
    if (a > lastLabel + 8) {
      const text = svg('text', {x: a, y: top - 8, class: 'tick window-label'},
        `profiled ${first}${last > first ? `–${last}` : ''}`);
      chart.append(text);
      lastLabel = a + 6.2 * text.textContent.length;
    }
  }
  for (const v of [0, yMax / 2, yMax]) {
    chart.append(svg('line', {x1: left, x2: width - right, y1: y(v), y2: y(v), class: 'grid'}));
    chart.append(svg('text', {x: left - 6, y: y(v) + 4, class: 'tick', 'text-anchor': 'end'}, `${num(v)} ${unit}`));
  }
  const ends = x1 === x0 ? [[x0, 'middle']] : [[x0, 'start'], [x1, 'end']];
  for (const [s, anchor] of ends) {
    chart.append(svg('text', {x: x(s), y: height - 6, class: 'tick', 'text-anchor': anchor}, `step ${s}`));
  }
  const profiled = new Set(windows.flatMap(([a, b]) => Array.from({length: b - a + 1}, (_, k) => a + k)));
  const inWindows = points.filter(([s]) => profiled.has(s)).map((p) => p[1]);
  const medians = [[median(values), `median, all ${values.length} steps`, 'median']];
  if (inWindows.length) medians.push([median(inWindows), `median, ${inWindows.length} profiled`, 'median-profiled']);
  const labelY = spread(medians.map(([v]) => y(v) + 4), 13);
  medians.forEach(([v, text, cls], i) => {
    chart.append(svg('line', {x1: left, x2: width - right, y1: y(v), y2: y(v), class: cls}));
    chart.append(svg('text', {x: width - right + 8, y: labelY[i], class: `tick ${cls}-label`},
      `${text}: ${num(v)} ${unit}`));
  });
  if (own.size && points.length > 1) chart.append(costBand(points, own, x, y, unit));
  if (points.length === 1) {
    chart.append(svg('circle', {cx: x(steps[0]), cy: y(values[0]), r: 3, class: 'dot'}));
  } else {
    chart.append(svg('polyline', {points: points.map(([s, v]) => `${x(s)},${y(v)}`).join(' '), class: 'line'}));
  }
  const slowSet = new Set(slow);
  for (const [s, v] of points.filter(([s]) => slowSet.has(s))) {
    chart.append(svg('circle', {cx: x(s), cy: y(v), r: 3.5, class: 'slow'},
      svg('title', {}, `slow step ${s}: ${num(v)} ${unit}`)));
  }
  for (const [s, v] of points.filter((p) => p[1] + (own.get(p[0]) || 0) > yMax)) {
    const [px, py] = [x(s), top];
    chart.append(svg('path', {d: `M${px - 5},${py + 7} L${px + 5},${py + 7} L${px},${py} Z`, class: 'off-scale'},
      svg('title', {}, `step ${s}: ${num(v)} ${unit} + kprof ${num(own.get(s) || 0)} ${unit}, above the axis`)));
  }
  return chart;
}

/** kprof's own cost as a band from each step's time up to its wall time, with the total and the largest step. */
function costBand(points, own, x, y, unit) {
  const top = points.map(([s, v]) => `${x(s)},${y(v + (own.get(s) || 0))}`);
  const bottom = [...points].reverse().map(([s, v]) => `${x(s)},${y(v)}`);
  const [worst, most] = [...own].reduce((a, b) => (b[1] > a[1] ? b : a));
  const total = [...own.values()].reduce((a, b) => a + b, 0);
  return svg('polygon', {points: [...top, ...bottom].join(' '), fill: PROFILER_COLOR, 'fill-opacity': 0.55,
    class: 'profiler'},
  svg('title', {}, `kprof's own cost: ${num(total)} ${unit} over ${own.size} steps, most at step ${worst} `
    + `(${num(most)} ${unit}); the line below it is the step without it`));
}

/**
 * One horizontal stacked bar per row: `rows` are {label, parts: [{value, color, name}]}; all bars share
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
      chart.append(svg('rect', {x, y, width: w, height: bar, fill: part.color},
        svg('title', {}, `${row.label}: ${part.name} ${num(part.value)} ${unit}`)));
      x += w;
    }
    chart.append(svg('text', {x: x + 5, y: y + bar - 3, class: 'tick'}, `${num(total(row))} ${unit}`));
  });
  return chart;
}

/**
 * Variants side by side on one time axis: a light bar to each median, a whisker from p10 to p90 and a dark mark
 * at the median, labelled at the mark. `items` are {label, median, low, high, color}; items without a median
 * are left out.
 */
export function rangeBars(items, unit = 'ms') {
  const shown = items.filter((it) => it.median !== null && it.median !== undefined);
  const row = 36, left = 130, right = 30, top = 6, axis = 26;
  const height = top + shown.length * row + axis;
  const width = pageWidth();
  const chart = frame(width, height, `median step time of ${shown.length} variants`);
  const max = Math.max(...shown.map((it) => it.high ?? it.median)) * 1.08 || 1;
  const x = (v) => left + (v / max) * (width - left - right);
  const bottom = top + shown.length * row;
  const step = tickStep(max, Math.max(2, Math.floor((width - left - right) / 90)));
  for (let v = 0; v <= max; v += step) {
    chart.append(svg('line', {x1: x(v), x2: x(v), y1: top, y2: bottom, class: 'grid'}));
    chart.append(svg('text', {x: x(v), y: bottom + 16, class: 'tick', 'text-anchor': 'middle'}, `${num(v)} ${unit}`));
  }
  chart.append(svg('line', {x1: left, x2: width - right, y1: bottom, y2: bottom, class: 'axis'}));
  shown.forEach((it, i) => {
    const mid = top + i * row + 23;
    chart.append(svg('text', {x: left - 8, y: mid + 4, class: 'tick', 'text-anchor': 'end'}, it.label));
    chart.append(svg('rect',
      {x: left, y: mid - 6, width: x(it.median) - left, height: 12, fill: it.color, class: 'range-bar'},
      svg('title', {}, `${it.label}: median ${num(it.median)} ${unit}`)));
    if (it.low !== null && it.high !== null) {
      chart.append(svg('line', {x1: x(it.low), x2: x(it.high), y1: mid, y2: mid, class: 'whisker'},
        svg('title', {}, `${it.label}: p10 ${num(it.low)} ${unit}, p90 ${num(it.high)} ${unit}`)));
      for (const v of [it.low, it.high]) {
        chart.append(svg('line', {x1: x(v), x2: x(v), y1: mid - 5, y2: mid + 5, class: 'whisker'}));
      }
    }
    chart.append(svg('line', {x1: x(it.median), x2: x(it.median), y1: mid - 8, y2: mid + 8, class: 'median-mark'}));
    const anchor = x(it.median) > width - right - 40 ? 'end' : 'middle';
    chart.append(svg('text', {x: x(it.median), y: mid - 11, class: 'tick value', 'text-anchor': anchor},
      `${num(it.median)} ${unit}`));
  });
  return chart;
}

/**
 * Signed changes from a centre line, one row each: increases to the right in `colors.increased`, decreases to the
 * left in `colors.decreased`, on one scale, each labelled with its value as `format` writes it. `items` are
 * {label, value, title}.
 */
export function changeBars(items, colors, format) {
  const row = 22, left = 320, right = 20, top = 4, room = 80; // room: for the value beside the longest bar
  const width = pageWidth();
  const height = 2 * top + items.length * row;
  const chart = frame(width, height, `${items.length} changes`);
  const max = Math.max(...items.map((it) => Math.abs(it.value))) || 1;
  const half = (width - left - right) / 2;
  const centre = left + half;
  chart.append(svg('line', {x1: centre, x2: centre, y1: 0, y2: height, class: 'axis'}));
  items.forEach((it, i) => {
    const y = top + i * row, up = it.value > 0;
    const w = Math.max(1, ((half - room) * Math.abs(it.value)) / max);
    chart.append(svg('text', {x: left - 8, y: y + 15, class: 'tick', 'text-anchor': 'end'}, it.label));
    chart.append(svg('rect', {x: up ? centre : centre - w, y: y + 4, width: w, height: row - 8,
      fill: colors[up ? 'increased' : 'decreased'], class: up ? 'increased' : 'decreased'},
    svg('title', {}, it.title)));
    chart.append(svg('text', {x: up ? centre + w + 4 : centre - w - 4, y: y + 15, class: 'tick value',
      'text-anchor': up ? 'start' : 'end'}, `${up ? '+' : '−'}${format(Math.abs(it.value))}`));
  });
  return chart;
}
