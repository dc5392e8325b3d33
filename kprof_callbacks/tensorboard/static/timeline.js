// One profiled step on a <canvas>: CPU threads (operators nested, labels, ProfilerStep), GPU streams (kernels,
// memcpy, memset) and the link from each launch to the GPU work it started. Wheel zooms around the pointer, drag
// pans, hovering shows an event's details, a click keeps them, a double click zooms to the event. Plain JS.
//
// `data` is the plugin's /timeline answer (analysis/slices.py): columns of events with times in ns from the
// step's start, rows already laid out (nesting depth on a thread, overlap on a stream). The /ranktimeline answer
// (analysis/ranktimeline.py) is one too, with every rank's lanes and per event its collective (`coll`, drawn in the
// collective's colour) and the time its rank waited there for the last one (`wait`, drawn darker); the lanes of the
// straggler and of the rank the others waited for are marked in the margin.

import {tickStep} from './charts.js';

const WAIT = 'rgba(0,0,0,0.38)', STRAGGLER = '#c0392b', LATE = '#7d3c98'; // as svgtimeline.py draws them
const ROW = 17, LANE_GAP = 10, GUTTER = 200, AXIS = 24, MAX_HEIGHT = 560, MIN_SPAN = 1000; // px, px, px, px, px, ns

/** `1.23 ms` for a duration in ns: three significant digits (svgtimeline.py's `duration` writes the same). */
export function duration(ns) {
  for (const [unit, size] of [['s', 1e9], ['ms', 1e6], ['µs', 1e3]]) {
    const value = ns / size;
    if (Math.abs(ns) >= size) {
      return `${value.toFixed(Math.max(0, 2 - Math.floor(Math.log10(Math.abs(value)))))} ${unit}`;
    }
  }
  return `${Math.round(ns)} ns`;
}

function hash(text) {
  let h = 0;
  for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) | 0;
  return h >>> 0;
}

/** The kind's colour, a little lighter or darker per name, so neighbours with different names stand apart. */
function shade(hex, name) {
  const k = ((hash(name) % 7) - 3) * 0.06;
  const rgb = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  return `rgb(${rgb.map((c) => Math.round(k > 0 ? c + (255 - c) * k : c * (1 + k))).join(',')})`;
}

/** Events and their layout: per (lane, row), the event indices in start order, for drawing and hit tests. */
function layout(data) {
  const ev = data.events;
  const laneTop = [];
  let y = AXIS + 4;
  for (const lane of data.lanes) {
    laneTop.push(y);
    y += lane.rows * ROW + LANE_GAP;
  }
  const rows = data.lanes.map((lane) => Array.from({length: lane.rows}, () => []));
  for (let i = 0; i < ev.start.length; i++) rows[ev.lane[i]][ev.row[i]].push(i);
  for (const lane of rows) for (const row of lane) row.sort((a, b) => ev.start[a] - ev.start[b]);
  const launches = new Map(); // runtime call -> the GPU work it launched
  ev.link.forEach((from, to) => {
    if (from >= 0) launches.set(from, [...(launches.get(from) || []), to]);
  });
  return {laneTop, rows, height: y, launches};
}

/** Per lane of a timeline of all ranks, its mark: {text, color} for the straggler's and the waited-for rank's. */
function rankMarks(data) {
  const marks = new Map();
  for (const r of data.ranks || []) {
    const said = [];
    if (data.straggler && data.straggler.rank === r.rank) said.push(['straggler', STRAGGLER]);
    if (data.late && data.late.rank === r.rank) said.push(['waited for', LATE]);
    if (!said.length) continue;
    const mark = {text: said.map(([t]) => t).join(', '), color: said[0][1]};
    for (let k = r.first_lane; k < r.first_lane + r.lanes; k++) marks.set(k, mark);
  }
  return marks;
}

/** Index into `row` of the last event starting at or before `t` (-1 if none). */
function lastStartingBy(row, starts, t) {
  let lo = 0, hi = row.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (starts[row[mid]] <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/**
 * The timeline of one step: returns a <div> holding the canvas and the details; `div.view` is the live view
 * ({t0, t1, scroll, zoom(), pan(), eventAt(), select()}), which the page and the tests drive.
 */
export function timelineView(data, colors) {
  const ev = data.events;
  const {laneTop, rows, height, launches} = layout(data);
  const canvas = document.createElement('canvas');
  canvas.className = 'timeline';
  canvas.tabIndex = 0;
  canvas.setAttribute('role', 'img');
  canvas.setAttribute('aria-label', `timeline of step ${data.step}: ${ev.start.length} events`);
  const tip = document.createElement('div');
  tip.className = 'timeline-tip';
  tip.hidden = true;
  const details = document.createElement('div');
  details.className = 'timeline-details';
  const root = document.createElement('div');
  root.className = 'timeline-wrap';
  root.append(canvas, tip, details);
  const fills = new Map(); // one shade per (kind, name): computed once, not per event and frame
  const marks = rankMarks(data);
  const color = (i) => {
    if (ev.coll && ev.coll[i] >= 0) return data.collectives[ev.coll[i]].color;
    const key = ev.kind[i] * data.names.length + ev.name[i];
    if (!fills.has(key)) fills.set(key, shade(colors[data.kinds[ev.kind[i]]] || '#999999', data.names[ev.name[i]]));
    return fills.get(key);
  };
  const view = {t0: 0, t1: Math.max(data.span_ns, MIN_SPAN), scroll: 0, hover: -1, selected: -1, drawn: 0};
  const viewHeight = () => Math.min(height, MAX_HEIGHT);
  let width = 480; // the canvas's CSS width, read once per draw: reading it per event would cost a layout check each
  const plotWidth = () => width - GUTTER;
  const x = (t) => GUTTER + ((t - view.t0) / (view.t1 - view.t0)) * plotWidth();
  const time = (px) => view.t0 + ((px - GUTTER) / plotWidth()) * (view.t1 - view.t0);

  /** Size the canvas's pixels to its box on the page (and the screen's pixel ratio) when they differ. */
  function fit() {
    const ratio = window.devicePixelRatio || 1;
    width = Math.max(canvas.clientWidth, 480);
    const w = Math.round(width * ratio), h = Math.round(viewHeight() * ratio);
    if (canvas.width === w && canvas.height === h) return;
    canvas.style.height = `${viewHeight()}px`;
    [canvas.width, canvas.height] = [w, h];
    canvas.getContext('2d').setTransform(ratio, 0, 0, ratio, 0, 0);
  }

  function draw() {
    fit();
    const ctx = canvas.getContext('2d');
    const h = viewHeight();
    ctx.clearRect(0, 0, width, h);
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    let drawn = 0;
    ctx.save();
    ctx.beginPath();
    ctx.rect(GUTTER, AXIS, width - GUTTER, h - AXIS);
    ctx.clip();
    rows.forEach((lane, l) => lane.forEach((row, r) => {
      const y = laneTop[l] + r * ROW - view.scroll;
      if (y + ROW < AXIS || y > h) return;
      let lastPixel = -1;
      for (let k = Math.max(0, lastStartingBy(row, ev.start, view.t0)); k < row.length; k++) {
        const i = row[k];
        if (ev.start[i] > view.t1) break;
        const x0 = Math.max(x(ev.start[i]), GUTTER - 1), x1 = Math.min(x(ev.start[i] + ev.dur[i]), width + 1);
        if (x1 < GUTTER) continue;
        if (x1 - x0 < 1 && Math.floor(x0) === lastPixel) continue; // one 1-px mark per pixel column is enough
        lastPixel = Math.floor(x0);
        ctx.fillStyle = color(i);
        ctx.fillRect(x0, y + 1, Math.max(x1 - x0, 1), ROW - 2);
        if (ev.wait && ev.wait[i] > 0) { // the part of a collective spent waiting for the last rank
          ctx.fillStyle = WAIT;
          ctx.fillRect(x0, y + 1, Math.max(Math.min(x(ev.start[i] + ev.wait[i]), x1) - x0, 1), ROW - 2);
        }
        drawn++;
        if (x1 - x0 > 40) {
          const name = data.names[ev.name[i]];
          const fits = Math.floor((x1 - x0 - 6) / 6.2);
          ctx.fillStyle = '#1f1f1f';
          ctx.fillText(name.length > fits ? `${name.slice(0, Math.max(fits - 1, 1))}…` : name, x0 + 3, y + ROW / 2);
        }
      }
    }));
    drawLinks(ctx);
    for (const i of [view.hover, view.selected]) {
      if (i < 0) continue;
      ctx.strokeStyle = '#000';
      ctx.lineWidth = 1.5;
      const y = laneTop[ev.lane[i]] + ev.row[i] * ROW - view.scroll;
      ctx.strokeRect(x(ev.start[i]), y + 1, Math.max(x(ev.start[i] + ev.dur[i]) - x(ev.start[i]), 2), ROW - 2);
    }
    ctx.restore();
    drawGutter(ctx, h);
    drawAxis(ctx);
    view.drawn = drawn;
    root.dataset.drawn = String(drawn);
  }

  /** Arrows from the hovered or selected event's launch to the GPU work it started (or from it, for GPU work). */
  function drawLinks(ctx) {
    const pairs = [];
    for (const i of new Set([view.hover, view.selected])) {
      if (i < 0) continue;
      if (ev.link[i] >= 0) pairs.push([ev.link[i], i]);
      for (const to of launches.get(i) || []) pairs.push([i, to]);
    }
    ctx.strokeStyle = '#202020';
    ctx.fillStyle = '#202020';
    ctx.lineWidth = 1.2;
    for (const [from, to] of pairs) {
      const y0 = laneTop[ev.lane[from]] + ev.row[from] * ROW + ROW / 2 - view.scroll;
      const y1 = laneTop[ev.lane[to]] + ev.row[to] * ROW + 2 - view.scroll;
      const x0 = x(ev.start[from] + ev.dur[from] / 2), x1 = x(ev.start[to]);
      ctx.beginPath();
      ctx.moveTo(x0, y0);
      ctx.bezierCurveTo(x0, (y0 + y1) / 2, x1, (y0 + y1) / 2, x1, y1);
      ctx.stroke();
      ctx.beginPath();
      ctx.moveTo(x1, y1);
      ctx.lineTo(x1 - 4, y1 - 7);
      ctx.lineTo(x1 + 4, y1 - 7);
      ctx.fill();
    }
  }

  function drawGutter(ctx, h) {
    ctx.fillStyle = '#fafafa';
    ctx.fillRect(0, AXIS, GUTTER - 4, h - AXIS);
    ctx.fillStyle = '#3c3c3c';
    ctx.font = '12px system-ui, sans-serif';
    data.lanes.forEach((lane, l) => {
      const y = laneTop[l] - view.scroll;
      if (y + lane.rows * ROW < AXIS || y > h) return;
      const mark = marks.get(l);
      if (mark) {
        ctx.fillStyle = mark.color;
        ctx.fillRect(0, Math.max(y, AXIS), 3, lane.rows * ROW);
      }
      ctx.fillText(lane.name.length > 30 ? `${lane.name.slice(0, 29)}…` : lane.name, 6, Math.max(y, AXIS) + ROW / 2);
      ctx.fillStyle = '#3c3c3c';
      ctx.fillRect(0, y + lane.rows * ROW + LANE_GAP / 2, width, 0.5);
    });
    if (height > h) { // where the visible part lies in the lanes
      const bar = Math.max(20, ((h - AXIS) * h) / height);
      ctx.fillStyle = '#c4c4c4';
      ctx.fillRect(width - 5, AXIS + (view.scroll / (height - h)) * (h - AXIS - bar), 4, bar);
    }
  }

  function drawAxis(ctx) {
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, width, AXIS);
    ctx.fillStyle = '#5f5f5f';
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillText(`step ${data.step}, ${duration(data.span_ns)}`, 6, AXIS / 2);
    const step = tickStep(view.t1 - view.t0, Math.max(2, Math.floor(plotWidth() / 110)));
    for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      const px = x(t);
      ctx.fillRect(px, AXIS - 6, 1, 6);
      if (px < width - 50) ctx.fillText(duration(t), px + 3, AXIS / 2 - 2); // room for the label
    }
    ctx.fillRect(GUTTER, AXIS - 1, width - GUTTER, 1);
  }

  /** The event under (px, py) in canvas pixels, -1 if none; tiny events within 3 px count. */
  function eventAt(px, py) {
    if (px < GUTTER || py < AXIS) return -1;
    const y = py + view.scroll;
    const l = laneTop.findIndex((top, k) => y >= top && y < top + data.lanes[k].rows * ROW);
    if (l < 0) return -1;
    const row = rows[l][Math.floor((y - laneTop[l]) / ROW)];
    const t = time(px), slack = (3 / plotWidth()) * (view.t1 - view.t0);
    let best = -1, gap = Infinity;
    for (let k = Math.max(0, lastStartingBy(row, ev.start, t + slack) - 1); k < row.length; k++) {
      const i = row[k];
      if (ev.start[i] > t + slack) break;
      const d = t < ev.start[i] ? ev.start[i] - t : Math.max(0, t - ev.start[i] - ev.dur[i]);
      if (d <= slack && d < gap) [best, gap] = [i, d];
    }
    return best;
  }

  function clamp() {
    const span = Math.min(Math.max(view.t1 - view.t0, MIN_SPAN), Math.max(data.span_ns, MIN_SPAN) * 1.1);
    const lo = -0.05 * data.span_ns, hi = data.span_ns * 1.05;
    view.t0 = Math.min(Math.max(view.t0, lo), hi - span);
    view.t1 = view.t0 + span;
    view.scroll = Math.min(Math.max(view.scroll, 0), Math.max(height - viewHeight(), 0));
  }

  Object.assign(view, {
    /** Zoom by `factor` (< 1 zooms in) around canvas x `px`. */
    zoom(factor, px = GUTTER + plotWidth() / 2) {
      const t = time(px);
      view.t0 = t - (t - view.t0) * factor;
      view.t1 = t + (view.t1 - t) * factor;
      clamp();
      draw();
    },
    /** Move by `dx` pixels in time (positive: later) and `dy` pixels down the lanes. */
    pan(dx, dy = 0) {
      const shift = (dx / plotWidth()) * (view.t1 - view.t0);
      view.t0 += shift;
      view.t1 += shift;
      view.scroll += dy;
      clamp();
      draw();
    },
    /** Show a range of the step, in ns from its start. */
    show(t0, t1) {
      Object.assign(view, {t0, t1});
      clamp();
      draw();
    },
    eventAt,
    /** Where event `i`'s middle is drawn now, in canvas pixels: [x, y]. */
    position(i) {
      const y = laneTop[ev.lane[i]] + ev.row[i] * ROW + ROW / 2 - view.scroll;
      return [(x(ev.start[i]) + x(ev.start[i] + ev.dur[i])) / 2, y];
    },
    /** Keep event `i`'s details below the canvas (and its launch arrows drawn); -1 clears. */
    select(i) {
      view.selected = i;
      details.replaceChildren(...(i >= 0 ? describe(i) : []));
      draw();
    },
    draw,
  });

  /** Lines of details for event `i`: what, when, how long, shapes, Python stack, launch. */
  function describe(i) {
    const name = data.names[ev.name[i]];
    const kind = data.kinds[ev.kind[i]];
    const lines = [[name, 'name'], [`${kind} on ${data.lanes[ev.lane[i]].name}: ${duration(ev.dur[i])}, `
      + `starts at ${duration(ev.start[i])} into step ${data.step}`, '']];
    if (data.notes && data.notes[i]) lines.push([data.notes[i], '']);
    const mark = marks.get(ev.lane[i]);
    if (mark) lines.push([`this rank: ${mark.text}`, '']);
    if (ev.shape[i] >= 0) lines.push([`input shapes ${data.shapes[ev.shape[i]]}`, '']);
    const stack = [];
    let op = null;
    for (let p = ev.link[i] >= 0 ? ev.link[i] : ev.parent[i]; p >= 0; p = ev.parent[p]) { // GPU work: its launch's
      if (data.kinds[ev.kind[p]] === 'python') stack.push(data.names[ev.name[p]]);
      else if (op === null && data.kinds[ev.kind[p]] === 'operator') op = data.names[ev.name[p]];
    }
    if (op !== null && kind !== 'operator') lines.push([`${ev.link[i] >= 0 ? 'from' : 'inside'} ${op}`, '']);
    if (stack.length) {
      lines.push(['Python stack (innermost first):', '']);
      for (const frame of stack.slice(0, 12)) lines.push([frame, 'frame']);
      if (stack.length > 12) lines.push([`… ${stack.length - 12} more`, 'frame']);
    }
    const from = ev.link[i];
    if (from >= 0) {
      lines.push([`launched by ${data.names[ev.name[from]]} at ${duration(ev.start[from])}: started `
        + `${duration(ev.start[i] - ev.start[from])} after the launch call began`, '']);
    } else if (ev.kind[i] >= data.kinds.indexOf('kernel')) {
      lines.push(['launched before this step', '']);
    }
    for (const to of (launches.get(i) || []).slice(0, 4)) {
      const later = duration(ev.start[to] - ev.start[i]);
      lines.push([`launches ${data.names[ev.name[to]]}, which starts ${later} later`, '']);
    }
    return lines.map(([text, cls]) => Object.assign(document.createElement('div'),
      {textContent: text, className: cls}));
  }

  function pointer(e) {
    const box = canvas.getBoundingClientRect();
    return [e.clientX - box.left, e.clientY - box.top];
  }

  let drag = null, dragged = false; // a drag ends in a click event too: it must not select
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const [px] = pointer(e);
    if (e.shiftKey) view.pan(0, e.deltaY);
    else if (Math.abs(e.deltaX) > Math.abs(e.deltaY)) view.pan(e.deltaX);
    else view.zoom(Math.exp(e.deltaY * 0.002), px);
  }, {passive: false});
  canvas.addEventListener('mousedown', (e) => {
    drag = {x: e.clientX, y: e.clientY, moved: 0};
  });
  function endDrag() {
    dragged = drag !== null && drag.moved > 3;
    drag = null;
    canvas.style.cursor = '';
  }
  canvas.addEventListener('mouseup', endDrag);
  canvas.addEventListener('mousemove', (e) => {
    const [px, py] = pointer(e);
    if (drag) {
      const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      drag.moved += Math.abs(dx) + Math.abs(dy);
      Object.assign(drag, {x: e.clientX, y: e.clientY});
      canvas.style.cursor = 'grabbing';
      view.pan(-dx, -dy);
      return;
    }
    const i = eventAt(px, py);
    if (i !== view.hover) {
      view.hover = i;
      draw();
    }
    tip.hidden = i < 0;
    if (i >= 0) {
      tip.replaceChildren(...describe(i));
      tip.style.left = `${Math.min(px + 14, width - 360)}px`;
      tip.style.top = `${py + 16}px`;
    }
  });
  canvas.addEventListener('mouseleave', () => {
    endDrag();
    tip.hidden = true;
    view.hover = -1;
    draw();
  });
  canvas.addEventListener('click', (e) => {
    if (!dragged) view.select(eventAt(...pointer(e)));
  });
  canvas.addEventListener('dblclick', (e) => {
    const i = eventAt(...pointer(e));
    if (i >= 0) view.show(ev.start[i] - ev.dur[i] * 0.1, ev.start[i] + ev.dur[i] * 1.1);
  });
  canvas.addEventListener('keydown', (e) => {
    const keys = {w: () => view.zoom(0.8), s: () => view.zoom(1.25), a: () => view.pan(-80), d: () => view.pan(80),
      0: () => view.show(0, data.span_ns)};
    if (keys[e.key]) keys[e.key]();
  });
  new ResizeObserver(draw).observe(root);
  root.view = view;
  return root;
}
