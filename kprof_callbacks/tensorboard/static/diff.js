// The tab's diff view: `kprof diff` of run B against run A (or steps of each), from the plugin's /diff route.
// Names, tables and colours are the reports' (diff_report.py, breakdown.py): what `kprof diff` prints, drawn.

import {changeBars, num, rangeBars} from './charts.js';
import {TOP, duration, getJSON, h, level, mb, note, query, section, shorten, table, windowsOf} from './dom.js';

const TIMELINE_KIND = {op: 'operator', nccl: 'communication'}; // a row's kind as the timeline colours it
const CHART_ROWS = 20;
const percent = (share) => `${+(100 * share).toFixed(2)}%`;

/** The view (for the page's picker and #hash) of the diff of run `b` against run `a`, steps optional. */
export function diffView(params) {
  return `diff=${query(Object.fromEntries(Object.entries(params).filter(([, value]) => value)))}`;
}

/** The diff page for `params` (URLSearchParams: a, b, a_steps, b_steps): a form, then the diff once both are set. */
export async function diffPage(params, {runs, legend, go}) {
  const head = section('Diff: B against A', diffForm(params, runs, go));
  if (!params.get('a') || !params.get('b')) {
    head.append(note('Pick run A and run B, and steps of either if you like (numbers and ranges such as 2-4,7; '
      + 'two selections of one run must not overlap). The same as kprof diff A B in a terminal.'));
    return [head];
  }
  let data;
  try {
    data = await getJSON(`diff?${params}`);
  } catch (err) {
    head.append(note(`No diff: ${err.message}`, 'error'));
    return [head];
  }
  const d = data.diff;
  const rows = d.changes.map((c, i) => ({...c, shown: data.names[i]}));
  const ci = `${level(d.settings.row_confidence)} CI (FDR-adjusted)`;
  const capture = (d.capture || []).map((line) => h('li', {class: 'diag warning'}, line)); // each side's own check
  head.append(...[
    h('p', {class: 'meta'}, 'A: ', sideText(d.a), h('br'), 'B: ', sideText(d.b), h('br'),
      `Diffed in ${num(data.seconds)} s at ${new Date(data.computed_at * 1000).toLocaleTimeString()}.`),
    capture.length ? h('ul', {class: 'diagnostics', id: 'diff-capture'}, capture) : null,
    h('p', {class: 'headline', id: 'diff-headline'}, data.headline)].filter(Boolean));
  return [head, stepSection(d, legend), changesSection(rows, legend),
    data.groups.map((g) => groupSection(g, rows, legend, ci)), findingsSection(d.diagnostics), rulesSection(d)];
}

/** Run A and run B, steps of each, Swap and Diff; `go(view)` opens the diff asked for. */
function diffForm(params, runs, go) {
  const pick = (side, fallback) => {
    const el = h('select', {id: `diff-${side}`, 'aria-label': `run ${side.toUpperCase()}`},
      runs.map((r) => h('option', {value: r.run}, r.run)));
    el.value = params.get(side) || fallback;
    return el;
  };
  const steps = (side) => h('input', {type: 'text', id: `diff-${side}-steps`, size: 12, placeholder: 'all steps',
    'aria-label': `steps of ${side.toUpperCase()}`, value: params.get(`${side}_steps`) || ''});
  const a = pick('a', runs[0].run);
  const b = pick('b', (runs.find((r) => r.run !== a.value) || runs[0]).run);
  const [aSteps, bSteps] = [steps('a'), steps('b')];
  const submit = (event) => {
    event.preventDefault();
    go(diffView({a: a.value, b: b.value, a_steps: aSteps.value.trim(), b_steps: bSteps.value.trim()}));
  };
  const swap = () => {
    [a.value, b.value, aSteps.value, bSteps.value] = [b.value, a.value, bSteps.value, aSteps.value];
  };
  return h('form', {class: 'controls', id: 'diff-form', onsubmit: submit},
    h('label', {}, 'A ', a), h('label', {}, 'steps ', aSteps),
    h('label', {}, 'B ', b), h('label', {}, 'steps ', bSteps),
    h('button', {type: 'button', onclick: swap}, 'Swap'), h('button', {type: 'submit'}, 'Diff'));
}

/** `run@steps=2-3 (run torch; steps 2-3: 2 steps, 4 samples over ranks)`, as diff_report words a side. */
function sideText(side) {
  const steps = windowsOf(side.steps).map(([first, last]) => (first === last ? first : `${first}-${last}`));
  const samples = side.samples !== side.steps.length ? `, ${side.samples} samples over ranks` : '';
  return `${side.source} (run ${side.run}; steps ${steps.join(',') || 'whole trace'}: `
    + `${side.steps.length} step${side.steps.length === 1 ? '' : 's'}${samples})`;
}

const signed = (value, unit) => `${value > 0 ? '+' : value < 0 ? '−' : ''}${unit(Math.abs(value))}`;
const times = (x) => (typeof x === 'number' ? `${x.toFixed(3)}x` : String(x)); // JSON gives "Infinity" as text

/** The colour of a change: red for more time or more calls, green for less, none when not significant. */
function changeStyle(row, legend) {
  return row.significant ? `color:${legend.changes[row.change > 0 ? 'increased' : 'decreased']}` : null;
}

function stepSection(d, legend) {
  const t = d.step_time;
  const [gpu, , other] = legend.parts.map((p) => p.color);
  const chart = rangeBars([
    {label: 'A', median: t.a_median_us / 1000, low: null, high: null, color: other},
    {label: 'B', median: t.b_median_us / 1000, low: null, high: null, color: gpu},
  ]);
  const moved = {faster: 'decreased', slower: 'increased'}[t.verdict];
  const verdict = moved ? `B is ${t.verdict}` : t.verdict;
  const interval = t.low === null
    ? ` (${t.a_steps} against ${t.b_steps} steps; the rank test needs ${t.min_steps} a side)`
    : ` [${level(d.settings.confidence)} CI ${times(t.low)}–${times(t.high)}]`;
  return section('Step time',
    h('p', {id: 'diff-step-time'}, `Medians ${duration(t.a_median_us)} (A) and ${duration(t.b_median_us)} (B): speedup `
      + `${times(t.speedup)}${interval}: `,
    h('b', {class: 'verdict', style: moved ? `color:${legend.changes[moved]}` : null}, verdict), '.'),
    h('figure', {}, chart),
    note(`Speedup = a typical A step over a typical B step (the median of the A/B ratios over all pairs of steps), `
      + `its interval from the rank test that gives the verdict; the mean step time changed by `
      + `${signed(d.mean_step_change_us, duration)}.${t.note ? ` ${t.note}` : ''}`));
}

/** A row's name as the reports show it, `new` or `gone` marked. */
function nameCell(row) {
  const presence = row.status === 'new' || row.status === 'gone';
  return [presence ? h('span', {class: `badge ${row.status}`}, row.status) : null, shorten(row.shown)];
}

function changesSection(rows, legend) {
  const timed = rows.filter((r) => r.significant && r.kind !== 'count' && r.kind !== 'memory');
  if (!timed.length) return null;
  const items = timed.slice(0, CHART_ROWS).map((r) => ({
    label: r.kind === 'op' ? shorten(r.shown, 48) : `${r.kind} '${shorten(r.shown, 40)}'`, value: r.change,
    title: `${r.name}: ${signed(r.change, duration)} per step (${r.verdict})`,
  }));
  const more = timed.length > CHART_ROWS ? ` The largest ${CHART_ROWS} of ${timed.length} are drawn.` : '';
  return section('Significant changes in time per step',
    h('figure', {id: 'diff-chart'}, changeBars(items, legend.changes, duration)),
    note(`Right, in red: more time per step in B; left, in green: less.${more}`));
}

function groupSection(group, allRows, legend, ci) {
  const rows = allRows.filter((r) => group.kinds.includes(r.kind));
  if (!rows.length) return null;
  const unit = {time: duration, bytes: mb}[group.value] || num;
  const color = (kind) => legend.kinds[TIMELINE_KIND[kind] || kind];
  const kind = (k) => [h('span', {class: 'swatch', style: `background:${color(k)}`}), k];
  const calls = (r) => (r.a_calls === r.b_calls ? num(r.a_calls) : `${num(r.a_calls)} → ${num(r.b_calls)}`);
  const columns = [
    {label: 'name', get: (r) => r, fmt: nameCell, cls: 'name', title: (r) => r.name, keep: true},
    group.kinds.length > 1 ? {label: 'kind', get: (r) => r.kind, fmt: kind, cls: 'tag', keep: true} : null,
    {label: 'A', get: (r) => r.a, fmt: unit, keep: true},
    {label: 'B', get: (r) => r.b, fmt: unit, keep: true},
    {label: 'change', get: (r) => r.change, fmt: (x) => signed(x, unit), keep: true},
    {label: ci, get: (r) => r, cls: 'num', keep: true,
      fmt: (r) => (r.low === null ? '–' : `[${signed(r.low, unit)}, ${signed(r.high, unit)}]`)},
    group.value === 'time' ? {label: 'calls/step', get: (r) => r, fmt: calls, cls: 'num', keep: true} : null,
    {label: 'verdict', get: (r) => r, fmt: (r) => h('span', {style: changeStyle(r, legend)}, r.verdict), cls: 'tag',
      keep: true},
  ].filter(Boolean);
  const significant = rows.filter((r) => r.significant).length;
  return section(`${group.title}: ${significant} of ${rows.length} significant`,
    table(columns, rows, TOP, null, (r) => `change ${r.status}`));
}

function findingsSection(diagnostics) {
  if (!diagnostics.length) return null;
  return section('Findings that appeared or went away', h('ul', {class: 'diagnostics', id: 'diff-findings'},
    diagnostics.map((x) => h('li', {class: `diag ${x.change === 'appeared' ? 'warning' : 'info'}`, 'data-kind': x.kind},
      h('span', {class: 'badge'}, x.change), h('span', {class: 'kind'}, x.kind.replaceAll('_', ' ')), ' ',
      x.message))));
}

function rulesSection(d) {
  const s = d.settings;
  return section('How to read it',
    note(`Rows: per-step means of A and B. A change is significant when it passes the test (${s.test}; false `
      + `discovery rate ${percent(1 - s.confidence)} here) and exceeds ${percent(s.noise_threshold)} of A's value; `
      + `each interval is Welch's at the level the false-discovery control used (${level(s.row_confidence)}), so it `
      + 'excludes 0 for the rows it kept.'),
    d.notes.map((n) => note(`Note: ${n}`)));
}
