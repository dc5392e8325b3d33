// The timeline of all ranks: one step of every rank of a multi-rank run on one clock, drawn by timeline.js from the
// plugin's /ranktimeline answer (analysis/ranktimeline.py). A step at a time; the CPU box adds each rank's main
// thread.

import {getJSON, h, ms, note, query, section} from './dom.js';
import {duration, timelineView} from './timeline.js';

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
  said.push(`${data.collectives.length} collectives matched across ranks`);
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
