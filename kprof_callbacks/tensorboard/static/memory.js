// The tab's memory view: what fills memory at the peak of the median step (the allocated-memory curve over the
// step, what was alive at the peak by kind and by module, the largest blocks), and each CUDA allocator snapshot's
// summary (its history's peak, the lines holding memory then, out-of-memory events), from the plugin's /memory route.
// The snapshot is summarized by the plugin (kprof's own reader): the page never loads the pickle. A big snapshot
// the plugin is still reading comes first as its end state, marked partial; the page asks again every second and
// draws the full view in its place once the read ends.

import {num, svg} from './charts.js';
import {getJSON, h, mb, note, pct, query, section, shorten, table} from './dom.js';

const PHASE_FILL = {forward: '#e8f0fa', backward: '#fbeee0', optimizer: '#e6f4f1', zero_grad: '#e6f4f1'};
const WIDTH = 1000;

/** The section, filled once the plugin answers (a run still being summarized, or a snapshot still being read, is
 * asked again every second). */
export function memorySection(run, legend) {
  const body = h('div', {id: 'memory'}, note('Loading memory…'));
  (async () => {
    for (;;) {
      let data;
      try {
        data = await getJSON(`memory?${query({run})}`);
      } catch (err) {
        body.replaceChildren(note(`No memory view: ${err.message}`, 'error'));
        return;
      }
      if (!data.pending) {
        body.replaceChildren(...memoryView(data.memory, legend).flat(Infinity).filter(Boolean));
        if (!(data.memory && data.memory.snapshots.some((s) => s.reading))) return;
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  })();
  return section('Memory', body);
}

function memoryView(m, legend) {
  if (!m) {
    return [note('No memory events in these traces: profile with profile_memory=True (and memory_snapshot=True for '
      + "the CUDA allocator's history) to see what fills memory at the peak.")];
  }
  const kinds = Object.fromEntries(legend.memory_kinds.map((k) => [k.key, k]));
  const parts = [];
  if (m.shown) parts.push(...peakView(m, kinds));
  for (const s of m.snapshots) parts.push(snapshotView(s));
  return parts;
}

/** Bytes over time: a line, the phases shaded behind it, the peak marked. `points` are [[x, bytes], ...]. */
function curve(points, {phases = [], second = null, unit = 'ms', label}) {
  const height = 200, left = 70, right = 20, top = 12, bottom = 26;
  const chart = svg('svg', {viewBox: `0 0 ${WIDTH} ${height}`, class: 'chart', role: 'img', 'aria-label': label});
  const xs = points.map((p) => p[0]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs, Math.min(...xs) + 1e-9)];
  const yMax = Math.max(...points.map((p) => p[1]), ...(second || []).map((p) => p[1]), 1);
  const x = (v) => left + (WIDTH - left - right) * (v - x0) / (x1 - x0);
  const y = (v) => top + (height - top - bottom) * (1 - v / yMax);
  for (const [name, lo, hi] of phases) {
    if (PHASE_FILL[name]) {
      chart.append(svg('rect', {x: x(lo), y: top, width: Math.max(x(hi) - x(lo), 1), height: height - top - bottom,
        fill: PHASE_FILL[name]}, svg('title', {}, name)));
    }
  }
  const path = (pts, cls) => svg('polyline', {class: cls, points: pts.map((p) => `${x(p[0])},${y(p[1])}`).join(' ')});
  if (second) chart.append(path(second, 'line reserved'));
  chart.append(path(points, 'line'));
  const peak = points.reduce((a, b) => (b[1] > a[1] ? b : a));
  chart.append(svg('circle', {class: 'slow', cx: x(peak[0]), cy: y(peak[1]), r: 4}, svg('title', {}, `peak ${mb(peak[1])}`)));
  chart.append(svg('text', {class: 'tick', x: 4, y: top + 10}, mb(yMax)), svg('text', {class: 'tick', x: 4, y: height - bottom}, '0'));
  chart.append(svg('text', {class: 'tick', x: left, y: height - 6}, `${num(0)} ${unit}`),
    svg('text', {class: 'tick', x: WIDTH - right, y: height - 6, 'text-anchor': 'end'},
      `${num(unit === 'ms' ? (x1 - x0) / 1000 : x1 - x0)} ${unit}`));
  return chart;
}

/** One bar: the peak split by kind, a legend under it. */
function kindsBar(shown, kinds) {
  const chart = svg('svg', {viewBox: `0 0 ${WIDTH} 26`, class: 'chart', role: 'img', 'aria-label': 'memory at the peak by kind'});
  let at = 0;
  for (const [key, value] of Object.entries(shown.kinds)) {
    if (value <= 0) continue;
    const w = WIDTH * value / (shown.peak || 1);
    chart.append(svg('rect', {x: at, y: 2, width: w, height: 22, fill: kinds[key].color},
      svg('title', {}, `${kinds[key].name}: ${mb(value)} (${pct(value / shown.peak)})`)));
    at += w;
  }
  const shownKinds = Object.keys(shown.kinds).filter((k) => shown.kinds[k] > 0);
  return [h('figure', {id: 'memory-kinds'}, chart), h('p', {class: 'legend'}, shownKinds.map((k) => [
    h('span', {class: 'swatch', style: `background:${kinds[k].color}`}), h('span', {title: kinds[k].meaning}, `${kinds[k].name} `)]))];
}

function peakView(m, kinds) {
  const s = m.shown;
  const median = (k) => [...m.steps.map((r) => r.kinds[k] || 0)].sort((a, b) => a - b)[(m.steps.length - 1) >> 1];
  const kindRows = Object.keys(s.kinds).filter((k) => s.kinds[k] || m.steps.some((r) => r.kinds[k]))
    .map((k) => ({kind: kinds[k].name, bytes: s.kinds[k], share: s.kinds[k] / (s.peak || 1), median: median(k)}));
  const modules = new Map();
  for (const r of m.modules) {
    const row = modules.get(r.module) || {module: r.module, bytes: 0, kinds: []};
    row.bytes += r.bytes;
    row.kinds.push(`${kinds[r.kind].name} ${mb(r.bytes)}`);
    modules.set(r.module, row);
  }
  const when = (us, missing) => (us === null ? missing : `${num(us / 1000)} ms`);
  return [
    h('p', {class: 'meta', id: 'memory-peak'}, `Step ${s.step} (the median of ${m.steps.length} by peak): ${mb(s.peak)} `
      + `allocated at ${num(s.at_us / 1000)} ms, in ${s.phase}${s.where ? ` at ${s.where}` : ''}`
      + (s.reserved ? `; ${mb(s.reserved)} reserved` : '') + ` (${m.device}).`),
    h('figure', {id: 'memory-curve'}, curve(m.curve, {phases: m.phases, label: `allocated memory over step ${s.step}`})),
    note('Allocated memory over the step; shaded: forward (blue), backward (orange), optimizer (green); the dot: the peak.'),
    ...kindsBar(s, kinds),
    table([
      {label: 'kind', get: (r) => r.kind, cls: 'name', keep: true},
      {label: 'at the peak', get: (r) => r.bytes, fmt: mb, keep: true},
      {label: 'share', get: (r) => r.share, fmt: pct, keep: true},
      {label: 'median over steps', get: (r) => r.median, fmt: mb, keep: true},
    ], kindRows, 16, 'compact'),
    h('h3', {}, 'By module (or site) at the peak'),
    table([
      {label: 'module / site', get: (r) => shorten(r.module), title: (r) => r.module, keep: true},
      {label: 'bytes', get: (r) => r.bytes, fmt: mb, keep: true},
      {label: 'share', get: (r) => r.bytes / (s.peak || 1), fmt: pct, keep: true},
      {label: 'kinds', get: (r) => r.kinds.join(', '), cls: 'name', keep: true},
    ], [...modules.values()].sort((a, b) => b.bytes - a.bytes)),
    h('h3', {}, 'Largest blocks at the peak'),
    table([
      {label: 'size', get: (r) => r.bytes, fmt: mb, keep: true},
      {label: 'kind', get: (r) => kinds[r.kind].name, cls: 'tag', keep: true},
      {label: 'operator', get: (r) => shorten(r.op + (r.inner && r.inner !== r.op ? ` (${r.inner})` : ''), 70), cls: 'name'},
      {label: 'module / site', get: (r) => shorten(r.where, 60), cls: 'name', keep: true},
      {label: 'input shapes', get: (r) => shorten(r.shapes, 50), cls: 'name'},
      {label: 'allocated', get: (r) => when(r.allocated_us, 'before'), cls: 'num', keep: true},
      {label: 'freed', get: (r) => when(r.freed_us, 'not freed'), cls: 'num', keep: true},
    ], m.blocks),
  ];
}

function snapshotView(s) {
  const name = s.path.split('/').pop();
  if (s.error) return [h('h3', {}, `Snapshot ${name}`), note(s.error, 'error')];
  if (s.reading) return partialView(s, name);
  return [h('h3', {}, `CUDA allocator snapshot ${name} (${mb(s.bytes)})`), ...s.devices.map((d) => deviceView(d))];
}

function deviceView(d) {
  if (!d.entries) {
    return note(`Device ${d.device}: no history (${mb(d.allocated_end)} allocated, ${mb(d.reserved_end)} reserved at the end).`);
  }
  const unit = d.x === 'time_us' ? 'ms' : 'events';
  const start = d.curve.length ? d.curve[0][0] : 0;
  const at = (x) => (unit === 'ms' ? x - start : x);
  const allocated = d.curve.map((p) => [at(p[0]), p[1]]);
  const reserved = d.curve.map((p) => [at(p[0]), p[2]]);
  const ooms = d.oom.length ? h('ul', {class: 'problems'}, d.oom.map((o) => h('li', {},
    `Out of memory: ${mb(o.size)} asked for, ${mb(o.device_free)} free on the device${o.site ? `, at ${o.site}` : ''}.`))) : null;
  return [
    h('p', {class: 'meta'}, `Device ${d.device}: ${d.entries} events; peak ${mb(d.peak)} allocated, `
      + `${mb(d.reserved_at_peak)} reserved then; ${d.segments} segment${d.segments === 1 ? '' : 's'} at the end, the largest free block `
      + `${mb(d.largest_free)}.`),
    h('figure', {class: 'snapshot-curve'}, curve(allocated, {second: reserved, unit, label: `device ${d.device} memory over the history`})),
    note('Allocated (line) and reserved (pale line) over the recorded history; the dot: the peak.'),
    ooms,
    table([
      {label: 'allocation site at the peak', get: (r) => shorten(r.site, 100), title: (r) => r.site, keep: true},
      {label: 'bytes', get: (r) => r.bytes, fmt: mb, keep: true},
      {label: 'blocks', get: (r) => r.blocks, fmt: String, keep: true},
    ], d.sites),
    table([
      {label: 'largest blocks at the peak', get: (r) => mb(r.size), cls: 'num', keep: true},
      {label: 'site', get: (r) => shorten(r.site, 80), title: (r) => r.frames.join('\n'), cls: 'name', keep: true},
    ], d.blocks, 10),
  ];
}

/** A snapshot whose history is still being read: what is in use at its end (not the peak), and how far the read is. */
function partialView(s, name) {
  const read = h('p', {class: 'meta snapshot-partial'}, `History still being read: ${pct(s.reading.done / (s.reading.total || 1))}. `
    + 'Shown meanwhile: the end state of the snapshot (the blocks in use when it was taken), not the peak of its history.');
  if (!s.devices.length) {
    return [h('h3', {}, `CUDA allocator snapshot ${name} (${mb(s.bytes)})`), read,
      note('This file holds its history before its segments: nothing to show until the history is read.')];
  }
  return [h('h3', {}, `CUDA allocator snapshot ${name} (${mb(s.bytes)})`), read, ...s.devices.map((d) => [
    h('p', {class: 'meta'}, `Device ${d.device} at the end: ${mb(d.allocated_end)} allocated, ${mb(d.reserved_end)} reserved; `
      + `${d.segments} segment${d.segments === 1 ? '' : 's'}, the largest free block ${mb(d.largest_free)}.`),
    table([
      {label: 'allocation site at the end (not the peak)', get: (r) => shorten(r.site || '(no stack recorded)', 100), title: (r) => r.site, keep: true},
      {label: 'bytes', get: (r) => r.bytes, fmt: mb, keep: true},
      {label: 'blocks', get: (r) => r.blocks, fmt: String, keep: true},
    ], d.end_sites),
    table([
      {label: 'largest blocks at the end', get: (r) => mb(r.size), cls: 'num', keep: true},
      {label: 'site', get: (r) => shorten(r.site || '(no stack recorded)', 80), title: (r) => r.frames.join('\n'), cls: 'name', keep: true},
    ], d.end_blocks, 10),
  ])];
}
