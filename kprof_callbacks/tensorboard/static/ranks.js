// The views of a multi-rank run: each rank's mean step and collectives (from the summary), and the timeline of all
// ranks: one step of every rank on one clock, drawn by timeline.js from the plugin's /ranktimeline answer
// (analysis/ranktimeline.py), a step at a time; the CPU box adds each rank's main thread.

import {num, stackedBars} from './charts.js';
import {getJSON, h, ms, note, pct, query, section, table} from './dom.js';
import {duration, timelineView} from './timeline.js';

/** A rank's mean step in breakdown.RANK_PARTS: computing, both, communicating, neither. */
function rankParts(r) {
  return {
    compute_only_us: r.compute_us - r.overlap_us, overlap_us: r.overlap_us, exposed_comm_us: r.exposed_comm_us,
    rest_us: Math.max(r.step_us - r.compute_us - r.exposed_comm_us, 0),
  };
}

/** Each rank's collectives (and FSDP phases): means per step, from the summary's per-step `comm` rows. */
function commByRank(ranks, comm) {
  const steps = new Map(ranks.map((r) => [r.rank ?? r.worker, r.steps]));
  const rows = new Map();
  for (const c of comm) {
    const who = c.rank ?? c.worker;
    const group = c.group ? `${c.group}${c.group_size ? ` (${c.group_size} ranks)` : ''}` : '';
    const key = `${who}\u0000${c.collective}\u0000${group}\u0000${c.phase}`;
    if (!rows.has(key)) {
      rows.set(key, {who, collective: c.collective, group, phase: c.phase, calls: 0, total_us: 0, overlap_us: 0,
        exposed_us: 0});
    }
    const row = rows.get(key);
    for (const f of ['calls', 'total_us', 'overlap_us', 'exposed_us']) row[f] += c[f] / (steps.get(who) || 1);
  }
  return [...rows.values()].sort((a, b) => String(a.who).localeCompare(String(b.who), undefined, {numeric: true})
    || b.exposed_us - a.exposed_us);
}

/** Ranks (means per step): a bar per rank, the ranks table, communication by collective, the slowest rank per step. */
export function ranksSection(ranks, skew, comm, parts) {
  const bars = ranks.map((r) => {
    const value = rankParts(r);
    const shown = parts.map((p) => ({value: value[p.key] / 1000, color: p.color, name: p.name}));
    return {label: `rank ${r.rank ?? r.worker}`, parts: shown};
  });
  const legend = h('p', {class: 'legend'}, parts.map((p) => [
    h('span', {class: 'swatch', style: `background:${p.color}`}), h('span', {title: p.meaning}, `${p.name} `)]));
  const columns = [
    {label: 'rank / worker', get: (r) => r.rank ?? r.worker, cls: 'name', keep: true},
    {label: 'steps', get: (r) => r.steps, fmt: String, keep: true},
    {label: 'step', get: (r) => r.step_us, fmt: ms, keep: true},
    {label: 'compute', get: (r) => r.compute_us, fmt: ms, keep: true},
    {label: 'comm', get: (r) => r.comm_us, fmt: ms, keep: true},
    {label: 'comm share', get: (r) => r.comm_share, fmt: pct, keep: true},
    {label: 'overlapped', get: (r) => r.overlap_share, fmt: pct, keep: true},
    {label: 'exposed comm', get: (r) => r.exposed_comm_us, fmt: ms, keep: true},
    {label: 'waits for others', get: (r) => r.waited_us, fmt: ms},
    {label: 'others wait for it', get: (r) => r.late_us, fmt: ms},
    {label: 'clock offset', get: (r) => r.clock_offset_us, fmt: ms},
  ];
  const skewColumns = [
    {label: 'step', get: (r) => r.step, cls: 'num', keep: true},
    {label: 'slowest rank', get: (r) => r.slowest_rank, cls: 'num', keep: true},
    {label: 'its compute', get: (r) => r.slowest_compute_us, fmt: ms, keep: true},
    {label: 'median compute', get: (r) => r.median_compute_us, fmt: ms, keep: true},
    {label: 'lag', get: (r) => r.lag_us, fmt: ms, keep: true},
  ];
  const commColumns = [
    {label: 'rank / worker', get: (r) => r.who, cls: 'name', keep: true},
    {label: 'collective', get: (r) => r.collective, cls: 'name', keep: true},
    {label: 'group', get: (r) => r.group, cls: 'name'},
    {label: 'phase', get: (r) => r.phase, cls: 'name'},
    {label: 'calls', get: (r) => r.calls, fmt: num, keep: true},
    {label: 'time', get: (r) => r.total_us, fmt: ms, keep: true},
    {label: 'overlapped', get: (r) => r.overlap_us, fmt: ms, keep: true},
    {label: 'exposed', get: (r) => r.exposed_us, fmt: ms, keep: true},
  ];
  return section('Ranks (means per step)', h('figure', {id: 'ranks-bars'}, stackedBars(bars)), legend,
    table(columns, ranks, 64, 'compact'),
    comm.length
      ? [h('h3', {}, 'Communication by collective'), table(commColumns, commByRank(ranks, comm), 128, 'compact')]
      : null,
    skew.length ? [h('h3', {}, 'Slowest rank per step'), table(skewColumns, skew, 64, 'compact')] : null);
}

/** What the step's marks say: the straggler, the rank the others waited for, the collectives. */
function marksNote(data) {
  const said = [];
  if (data.straggler) {
    said.push(`straggler: rank ${data.straggler.rank}, the slowest to compute in this step `
      + `(+${ms(data.straggler.lag_us)} on the others' median)`);
  }
  if (data.late) {
    said.push(`waited for: rank ${data.late.rank}, the others waited ${duration(data.late.wait_ns)} for it`);
  }
  const hosts = new Map();
  for (const r of data.ranks) hosts.set(r.host, [...(hosts.get(r.host) || []), r.rank]);
  const n = data.collectives.length;
  said.push(`${n} collective${n === 1 ? '' : 's'} matched across ranks`);
  if (hosts.size > 1) {
    said.push(`${hosts.size} hosts, their clocks aligned: `
      + [...hosts].map(([host, ranks]) => `${host} (rank${ranks.length > 1 ? 's' : ''} ${ranks.join(', ')})`)
        .join(', '));
  }
  return h('p', {class: 'legend', id: 'rank-marks'}, `${said.join('; ')}.`);
}

/** The section: a step picker, the CPU box and the timeline, loaded after the page shows. */
export function ranksTimelineSection(name, colors) {
  const stepSel = h('select', {'aria-label': 'step', id: 'rank-timeline-step'});
  const cpu = h('input', {type: 'checkbox', id: 'rank-timeline-cpu'});
  const body = h('div', {id: 'rank-timeline'});
  let view = null;
  async function show(step) {
    body.replaceChildren(note('Loading every rank…'));
    const params = {run: name, cpu: cpu.checked ? '1' : '0'};
    if (step !== undefined) params.step = step;
    let data;
    try {
      data = await getJSON(`ranktimeline?${query(params)}`);
    } catch (err) {
      body.replaceChildren(note(`No timeline of the ranks: ${err.message}`, 'error'));
      return;
    }
    stepSel.replaceChildren(...data.steps.map((w) => h('option', {value: w.step}, `step ${w.step}, ${ms(w.wall_us)}`)));
    stepSel.value = String(data.step);
    view = timelineView(data, colors);
    body.replaceChildren(view, marksNote(data),
      note(`${data.ranks.length} ranks, ${data.lanes.length} lanes`
        + (data.collapsed ? ' (one row per rank: when it was busy, and its collectives)' : '') + '.'));
    view.view.draw(); // now that it has its width on the page
  }
  stepSel.addEventListener('change', () => show(stepSel.value));
  cpu.addEventListener('change', () => show(stepSel.value || undefined));
  show();
  return section('All ranks on one clock',
    h('div', {class: 'controls'}, h('label', {}, 'Step ', stepSel), h('label', {}, cpu, ' CPU threads'),
      h('button', {type: 'button', onclick: () => view && view.view.show(0, Infinity)}, 'Whole step')),
    note('Every rank\'s GPU streams on rank 0\'s clock (host clocks aligned on the ends of the collectives ranks '
      + 'share). Each collective has one colour on every rank that ran it; its darker start is the time that rank '
      + 'waited for the last one to arrive. Marked in the margin: the straggler (the slowest to compute) and the rank '
      + 'the others waited for longest. Wheel, drag, hover and click as in the timeline above.'),
    body);
}
