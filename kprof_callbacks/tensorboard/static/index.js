// The kprof tab. TensorBoard loads this ES module in the tab's iframe and calls render(); every request
// goes to this plugin's routes (relative URLs under data/plugin/kprof/), nothing to the network.

import {PROFILER_COLOR, lineChart, median, num, rangeBars, stackedBars} from './charts.js';
import {diffPage, diffView} from './diff.js';
import {getJSON, h, level, mb, ms, note, pct, query, section, shorten, table, windowsOf} from './dom.js';
import {ranksSection, ranksTimelineSection} from './ranks.js';
import {memorySection} from './memory.js';
import {modulesSection} from './modules.js';
import {timelineView} from './timeline.js';

const SLOW = 3; // a step slower than this times the median is marked slow (the slow-step trigger's default)
const state = {runs: [], comparisons: [], logdir: '', view: null, legend: null};
const DIFF = 'diff='; // the picker's value for every diff view (the view itself says which runs)

// -- page skeleton ------------------------------------------------------------------------------------------
const picker = h('select', {id: 'picker', 'aria-label': 'run', onchange: () => select(picker.value)});
const pickerLabel = h('label', {}, 'Run ', picker);
const status = h('span', {id: 'status', class: 'status'});
const main = h('main', {id: 'content'});

export async function render() {
  document.head.append(h('link', {rel: 'stylesheet', href: 'style.css'}), h('title', {}, 'kprof'));
  document.body.append(h('div', {class: 'wrap'},
    h('header', {},
      h('h1', {}, 'kprof'),
      pickerLabel,
      h('button', {type: 'button', onclick: () => load()}, 'Reload'),
      status),
    main));
  await load();
}

/** Fetch the run list (file stats only), refill the picker and show the selected view. */
async function load() {
  status.textContent = 'Loading runs…';
  let listing;
  try {
    listing = await getJSON('runs');
  } catch (err) {
    status.textContent = '';
    main.replaceChildren(note(`Could not list runs: ${err.message}`, 'error'));
    return;
  }
  Object.assign(state, {runs: listing.runs, comparisons: listing.comparisons, logdir: listing.logdir,
    legend: listing.legend});
  pickerLabel.hidden = !state.runs.length && !state.comparisons.length;
  if (pickerLabel.hidden) {
    status.textContent = '';
    main.replaceChildren(emptyPage());
    return;
  }
  const options = [];
  if (state.comparisons.length) {
    options.push(h('optgroup', {label: 'Comparisons'},
      state.comparisons.map((c) => h('option', {value: `compare=${c.dir}`}, `compare: ${c.dir === '.' ? '(logdir)' : c.dir}`))));
  }
  options.push(h('optgroup', {label: 'Runs'},
    state.runs.map((r) => h('option', {value: `run=${r.run}`}, `${r.run}  (${r.traces.length} trace${r.traces.length === 1 ? '' : 's'}, ${mb(r.bytes)})`))));
  if (state.runs.length) options.push(h('optgroup', {label: 'Diff'}, h('option', {value: DIFF}, 'diff: two runs…')));
  picker.replaceChildren(...options);
  const wanted = state.view || decodeURIComponent(location.hash.slice(1));
  const values = [...picker.querySelectorAll('option')].map((o) => o.value);
  const known = values.includes(wanted) || (state.runs.length && wanted.startsWith(DIFF));
  await select(known ? wanted : latestView());
}

/** The run or comparison written last: after `kprof.compare` that is the comparison, else the newest run. */
function latestView() {
  const items = [
    ...state.runs.map((r) => ({view: `run=${r.run}`, modified: r.modified})),
    ...state.comparisons.map((c) => ({view: `compare=${c.dir}`, modified: c.modified})),
  ];
  return items.reduce((a, b) => (b.modified > a.modified ? b : a)).view;
}

/** A link that opens `view` in this page (the #hash alone would not: the page is not told of hash changes). */
function viewLink(view, text) {
  return h('a', {href: `#${encodeURIComponent(view)}`, onclick: (e) => {
    e.preventDefault();
    select(view);
  }}, text);
}

async function select(view) {
  state.view = view;
  const [kind, name] = [view.slice(0, view.indexOf('=')), view.slice(view.indexOf('=') + 1)];
  picker.value = kind === 'diff' ? DIFF : view;
  main.dataset.view = view;
  history.replaceState(null, '', `#${encodeURIComponent(view)}`);
  status.textContent = `Loading ${kind === 'diff' ? 'the diff' : name}…`;
  const pages = {
    run: runPage,
    compare: comparePage,
    diff: (q) => diffPage(new URLSearchParams(q), {runs: state.runs, legend: state.legend, go: select}),
  };
  try {
    main.replaceChildren(...(await pages[kind](name)).flat().filter(Boolean));
  } catch (err) {
    main.replaceChildren(note(`Could not load ${name}: ${err.message}`, 'error'));
  }
  if (state.view === view) status.textContent = '';
}

function emptyPage() {
  const code = [
    'import kprof_callbacks as kprof',
    '',
    'with kprof.session("log") as s:       # traces go to log/<run>/',
    '    for batch in loader:',
    '        loss = model(batch).sum()',
    '        loss.backward(); opt.step(); opt.zero_grad()',
    '        s.step()',
  ].join('\n');
  return h('div', {class: 'empty', id: 'empty'},
    h('h2', {}, 'No kprof runs here yet'),
    h('p', {}, `Nothing in ${state.logdir || 'the logdir'} has torch.profiler trace files (*.pt.trace.json[.gz]) `
      + 'or a compare.json. Profile a few steps of your training loop:'),
    h('pre', {}, code),
    h('p', {}, 'then start ', h('code', {}, 'kprof tensorboard log'),
      ' again (or press Reload). In a terminal, ', h('code', {}, 'kprof summary log'), ' prints the same summary.'));
}

// -- one run --------------------------------------------------------------------------------------------------
/** The run's summary; while the plugin is still reading a big run, its progress in the status line, asked again
 * every second. */
async function summaryOf(name) {
  for (;;) {
    const data = await getJSON(`summary?${query({run: name})}`);
    if (!data.pending) return data;
    if (state.view === `run=${name}`) status.textContent = `Summarizing ${name}: ${mb(data.done)} of ${mb(data.total)}…`;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

async function runPage(name) {
  const [data, steptime] = await Promise.all([summaryOf(name), getJSON(`steptime?${query({run: name})}`)]);
  const s = data.summary;
  const files = data.files;
  const when = new Date(data.summarized_at * 1000).toLocaleTimeString();
  const parts = [
    h('p', {class: 'meta'}, `${files.traces.length} trace file${files.traces.length === 1 ? '' : 's'}, ${mb(files.bytes)}; `
      + `summarized in ${num(data.seconds)} s at ${when}` + (s && s.ranks.length > 1 ? `; ${s.ranks.length} ranks` : '')
      + '; ', viewLink(diffView({a: name}), 'diff it against another run')),
  ];
  if (data.error) parts.push(note(data.error, 'error'));
  if (data.problems.length) parts.push(problemsSection(data.problems));
  if (s) {
    const capture = s.diagnostics.filter(isCapture);
    if (capture.length) parts.push(captureSection(capture));
    parts.push(diagnosticsSection(s.diagnostics.filter((d) => !isCapture(d))));
  }
  const info = state.runs.find((r) => r.run === name);
  parts.push(stepTimeSection(steptime, s ? s.steps : [], info && info.comparison));
  if (s) {
    const gpu = s.kernels.length > 0;
    parts.push(stepsSection(s.steps, gpu), timelineSection(name, files, s.files), memorySection(name, state.legend));
    if (s.modules && s.modules.length) parts.push(modulesSection(name));
    parts.push(opsSection(s.ops, gpu));
    if (gpu) parts.push(kernelsSection(s.kernels));
    parts.push(labelsSection(s.labels, gpu));
    if (s.ranks.length > 1) {
      parts.push(ranksSection(s.ranks, s.step_skew, s.comm || [], state.legend.rank_parts),
        ranksTimelineSection(name, state.legend.kinds));
    }
  }
  parts.push(tracesSection(name, files, s ? s.memory_snapshots : []));
  return parts;
}

function problemsSection(problems) {
  return section('Files left out',
    note('Everything below comes from the other files of the run.'),
    h('ul', {class: 'problems', id: 'problems'}, problems.map((p) =>
      h('li', {}, p.file ? h('code', {}, p.file) : null, p.file ? ': ' : null, p.problem))));
}

/** A capture-health line (analysis/health.py): shown first, apart from the findings drawn from the capture. */
const isCapture = (d) => d.kind.startsWith('capture_');

function captureSection(lines) {
  return section('Capture', h('ul', {class: 'diagnostics', id: 'capture'}, lines.map((d) =>
    h('li', {class: 'diag warning', 'data-kind': d.kind}, d.message))));
}

function diagnosticsSection(diagnostics) {
  const order = {warning: 0, info: 1};
  const sorted = [...diagnostics].sort((a, b) => (order[a.severity] ?? 2) - (order[b.severity] ?? 2));
  const body = sorted.length
    ? h('ul', {class: 'diagnostics', id: 'diagnostics'}, sorted.map((d) =>
      h('li', {class: `diag ${d.severity}`, 'data-kind': d.kind},
        h('span', {class: 'badge'}, d.severity), h('span', {class: 'kind'}, d.kind.replaceAll('_', ' ')), ' ', d.message)))
    : note('No findings: nothing in these steps crossed a threshold (idle GPU, syncs, tiny kernels, slow steps, …).');
  return section('Findings', body);
}

function stepTimeSection({points, profiler, slow_step_trigger: trigger}, profiledSteps, comparison) {
  if (!points.length) {
    const why = comparison
      ? [`kprof.compare writes no step-time scalars; the step times of its variants are in the comparison `,
        viewLink(`compare=${comparison}`, comparison === '.' ? 'of the logdir' : comparison), '.']
      : ['No kprof/step_time_ms scalars for this run yet: the session writes them every 50 steps and at exit, and '
        + 'TensorBoard picks them up on its next reload (a few seconds).'];
    return section('Step time over the run', h('p', {class: 'note'}, ...why));
  }
  const values = points.map((p) => p[1]);
  const typical = median(values);
  const slow = points.filter(([, v]) => v > SLOW * typical);
  const windows = windowsOf(profiledSteps.map((r) => r.step));
  const after = !trigger ? [] : windows.map(([first]) => slow.filter(([n]) => n < first && first - n <= 4).pop())
    .map((found, i) => (found ? `profiled ${windows[i][0]}–${windows[i][1]} follows slow step ${found[0]}` : null))
    .filter(Boolean);
  const last = values[values.length - 1];
  return section('Step time over the run',
    h('figure', {}, lineChart(points, {windows, slow: slow.map(([n]) => n), profiler})),
    h('p', {class: 'legend'},
      profiler.length ? [h('span', {class: 'swatch', style: `background:${PROFILER_COLOR}`}),
        `kprof's own cost (kprof/profiler_ms: ${num(profiler.reduce((a, [, v]) => a + v, 0))} ms in all), `
        + 'above each step: the step time leaves it out '] : null,
      windows.length ? [h('span', {class: 'swatch window'}), 'profiled steps (the trace files) '] : null,
      slow.length ? [h('span', {class: 'swatch slow'}), `slow step (over ${SLOW}x the median) `] : null,
      'a triangle at the top: a step above the axis (hover for its time)'),
    note(`${points.length} steps, every step of the run (not only the profiled ones); `
      + `min ${num(Math.min(...values))} ms, max ${num(Math.max(...values))} ms, last ${num(last)} ms.`
      + (slow.length ? ` ${slow.length} slow: `
        + `${slow.slice(0, 8).map(([n, v]) => `step ${n} (${num(v)} ms)`).join(', ')}${slow.length > 8 ? ', …' : ''}.`
        : '')
      + (after.length ? ` ${after.join('; ')}: a capture the slow-step trigger may have started.` : '')));
}

function stepsSection(steps, gpu) {
  const {parts: allParts, columns: names} = state.legend;
  const parts = gpu ? allParts : allParts.filter((p) => p.key !== 'gpu_busy_us');
  const other = (r) => Math.max(r.wall_us - r.gpu_busy_us - r.cpu_only_us, 0); // breakdown.py's other_us
  const value = (p, r) => (p.key === 'other_us' ? other(r) : r[p.key]);
  const workers = new Set(steps.map((r) => r.worker)).size;
  const label = (r) => (workers > 1 ? `${r.rank ?? r.worker} #${r.step}` : `step ${r.step}`);
  const rows = steps.map((r) => ({
    label: label(r), parts: parts.map((p) => ({value: value(p, r) / 1000, color: p.color, name: p.name})),
  }));
  const legend = h('p', {class: 'legend'}, parts.map((p) => [
    h('span', {class: 'swatch', style: `background:${p.color}`}), h('span', {title: p.meaning}, `${p.name} `)]));
  const column = (key, fmt, keep = false) => ({
    label: names[key], get: key === 'other_us' ? other : (r) => r[key], fmt, keep,
  });
  const columns = [
    {label: 'step', get: (r) => r.step, cls: 'num', keep: true},
    {label: 'rank / worker', get: (r) => (workers > 1 ? (r.rank ?? r.worker) : null), cls: 'name'},
    column('wall_us', ms, true), column('gpu_busy_us', ms), column('gpu_idle_us', ms), column('kernel_us', ms),
    column('memcpy_us', ms), column('memset_us', ms), column('comm_us', ms), column('cpu_only_us', ms, true),
    column('other_us', ms, true), column('dataloader_us', ms), column('peak_memory', mb),
  ];
  return section('Per-step breakdown', h('figure', {}, stackedBars(rows)), legend, table(columns, steps, 64, 'compact'));
}

/**
 * One step of one trace file, drawn by timeline.js; the step is loaded after the page shows, a step at a time.
 * It opens on the first file the summary could read (`readable`: their paths), at that file's median step.
 */
function timelineSection(name, files, readable) {
  const fileSel = h('select', {'aria-label': 'trace file'},
    files.traces.map((f) => h('option', {value: f.name}, f.name)));
  const stepSel = h('select', {'aria-label': 'step', id: 'timeline-step'});
  const body = h('div', {id: 'timeline'});
  let view = null;
  async function show(file, step) {
    body.replaceChildren(note('Loading the timeline…'));
    const params = step === undefined ? {run: name, file} : {run: name, file, step};
    let data;
    try {
      data = await getJSON(`timeline?${query(params)}`);
    } catch (err) {
      body.replaceChildren(note(`No timeline: ${err.message}`, 'error'));
      return;
    }
    const walls = data.steps.map((w) => w.wall_us);
    const slowest = data.steps.reduce((a, b) => (b.wall_us > a.wall_us ? b : a)).step;
    const mid = median(walls);
    stepSel.replaceChildren(...data.steps.map((w) => h('option', {value: w.step},
      `${w.step < 0 ? 'whole trace' : `step ${w.step}`}, ${ms(w.wall_us)}`
      + (w.step === slowest && data.steps.length > 1 ? ' (slowest)' : w.wall_us === mid ? ' (median)' : ''))));
    stepSel.value = String(data.step);
    view = timelineView(data, state.legend.kinds);
    const kinds = [...new Set(data.events.kind)].sort((a, b) => a - b).map((k) => data.kinds[k]);
    body.replaceChildren(view, h('p', {class: 'legend'}, kinds.map((k) => [
      h('span', {class: 'swatch', style: `background:${state.legend.kinds[k]}`}), `${k} `])),
    note(`${data.events.start.length} events in ${data.lanes.length} lane${data.lanes.length === 1 ? '' : 's'}, `
      + `from ${data.file}.`));
    view.view.draw(); // now that it has its width on the page
  }
  fileSel.addEventListener('change', () => show(fileSel.value));
  stepSel.addEventListener('change', () => show(fileSel.value, stepSel.value));
  const first = readable.length ? readable[0].split('/').pop() : files.traces[0].name;
  fileSel.value = first;
  show(first);
  return section('Timeline',
    h('div', {class: 'controls'}, h('label', {}, 'Trace ', fileSel), h('label', {}, 'Step ', stepSel),
      h('button', {type: 'button', onclick: () => view && view.view.show(0, Infinity)}, 'Whole step')),
    note('Wheel: zoom · drag: pan · shift+wheel: scroll the lanes · hover: details · click: keep them · '
      + 'double-click: zoom to the event · W/S zoom, A/D pan, 0 resets (click the timeline first). '
      + 'Arrows lead from a launch (cudaLaunchKernel, cudaMemcpyAsync) to the GPU work it started.'),
    body);
}

function opsSection(ops, gpu) {
  const key = gpu ? 'self_cuda_us' : 'self_cpu_us';
  const sorted = [...ops].sort((a, b) => b[key] - a[key]);
  const columns = [
    {label: 'operator', get: (r) => shorten(r.name), title: (r) => r.name, keep: true},
    {label: 'calls', get: (r) => r.calls, fmt: String, keep: true},
    {label: 'self CPU', get: (r) => r.self_cpu_us, fmt: ms, keep: true},
    {label: 'CPU total', get: (r) => r.cpu_total_us, fmt: ms, keep: true},
    {label: 'self GPU', get: (r) => r.self_cuda_us, fmt: ms},
    {label: 'GPU total', get: (r) => r.cuda_total_us, fmt: ms},
    {label: 'self CPU mem', get: (r) => r.self_cpu_memory, fmt: mb},
    {label: 'self GPU mem', get: (r) => r.self_cuda_memory, fmt: mb},
  ];
  return section(`Top operators (by self ${gpu ? 'GPU' : 'CPU'} time)`, table(columns, sorted));
}

function kernelsSection(kernels) {
  const columns = [
    {label: 'kernel', get: (r) => shorten(r.name), title: (r) => r.name, keep: true},
    {label: 'kind', get: (r) => r.kind, cls: 'tag', keep: true},
    {label: 'count', get: (r) => r.count, fmt: String, keep: true},
    {label: 'total', get: (r) => r.total_us, fmt: ms, keep: true},
    {label: 'mean', get: (r) => r.mean_us, fmt: ms, keep: true},
    {label: 'max', get: (r) => r.max_us, fmt: ms, keep: true},
  ];
  return section('Top GPU kernels', table(columns, kernels));
}

function labelsSection(labels, gpu) {
  if (!labels.length) {
    return section('Labels', note('No record_function labels: wrap parts of a step in s.region("forward") to see them here.'));
  }
  const nested = labels.some((r) => r.contains.length);
  const columns = [
    {label: 'label', get: (r) => shorten(r.name), title: (r) => r.name, keep: true},
    {label: 'count', get: (r) => r.count, fmt: String, keep: true},
    {label: 'total', get: (r) => r.total_us, fmt: ms, keep: true},
    {label: 'mean', get: (r) => r.mean_us, fmt: ms, keep: true},
    {label: 'GPU time', get: (r) => (gpu ? r.cuda_total_us : 0), fmt: ms},
    {label: 'share of steps', get: (r) => r.step_share, fmt: pct, keep: true},
    {label: 'contains', get: (r) => r.contains.join(', '), cls: 'name contains'},
  ];
  return section('Labels (regions)', table(columns, labels),
    nested ? note('A label that contains others (under Lightning, Optimizer.step#... holds the forward and backward '
      + 'of its closure) counts their time too, so the shares add up to more than the steps.') : null);
}

function tracesSection(name, files, snapshots) {
  const rows = files.traces.map((f) => h('li', {},
    h('a', {href: `trace?${query({run: name, file: f.name})}`, download: f.name}, f.name), ` (${mb(f.bytes)})`));
  const pending = files.partial.length
    ? note(`${files.partial.length} file(s) still being written (*.partial) are not shown yet; press Reload when they land.`)
    : null;
  const perfetto = h('p', {},
    'The timeline above shows one step at a time. To see a whole trace file: download it, open ',
    h('a', {href: 'https://ui.perfetto.dev', target: '_blank', rel: 'noopener noreferrer'}, 'ui.perfetto.dev'),
    ', choose "Open trace file" and pick the downloaded file (.json and .json.gz both open; the file stays on '
    + 'your machine). chrome://tracing reads the same files.');
  const memory = snapshots.length
    ? note(`CUDA memory snapshots beside the traces: ${snapshots.map((p) => p.split('/').pop()).join(', ')} `
      + '(summarized under Memory above; pytorch.org/memory_viz opens them too).')
    : null;
  return section('Raw traces', h('ul', {class: 'files'}, rows), pending, perfetto, memory);
}

// -- a comparison -------------------------------------------------------------------------------------------
async function comparePage(dir) {
  const data = await getJSON(`compare?${query({dir})}`);
  if (data.error) return [note(data.error, 'error')];
  const c = data.data;
  const settings = c.settings || {};
  const variants = c.variants || [];
  const conf = settings.confidence ? `${level(settings.confidence)} CI` : 'CI';
  const check = (v) => {
    if (v.check_ok === null || v.check_ok === undefined) return v.name === c.baseline ? 'reference' : 'not checked';
    if (v.check_ok) return `ok (max rel err ${v.check_max_rel_err.toExponential(1)})`;
    return `FAILED at ${v.check_worst} (tol ${v.check_tol.toExponential(0)})`;
  };
  const runLink = (v) => (data.runs[v.name] ? viewLink(`run=${data.runs[v.name]}`, v.name) : v.name);
  const rows = variants.map((v) => h('tr', {class: v.status === 'ok' ? '' : 'failed'},
    h('td', {class: 'name'}, runLink(v)),
    h('td', {class: 'num'}, v.median_ms === null ? '–' : `${num(v.median_ms)} ms`),
    h('td', {class: 'num'}, v.p10_ms === null ? '–' : `${num(v.p10_ms)}–${num(v.p90_ms)} ms`),
    h('td', {class: 'num'}, v.speedup === null ? '–'
      : `${v.speedup.toFixed(2)}x` + (v.ci_low === null ? '' : ` [${v.ci_low.toFixed(2)}, ${v.ci_high.toFixed(2)}]`)),
    h('td', {class: 'name'}, v.verdict || v.status),
    h('td', {class: `name ${v.check_ok === false ? 'bad' : ''}`}, check(v)),
    h('td', {class: 'num'}, v.peak_mem_mb === null ? '–' : `${num(v.peak_mem_mb)} MB`)));
  const head = h('tr', {}, ['variant', 'median', 'p10–p90', `timed speedup [${conf}]`, 'verdict', 'correctness check',
    'peak memory']
    .map((t, i) => h('th', {class: [0, 4, 5].includes(i) ? 'name' : 'num'}, t)));
  const [gpu, , other] = state.legend.parts.map((p) => p.color);
  const chart = rangeBars(variants.map((v) => ({
    label: v.name, median: v.median_ms, low: v.p10_ms, high: v.p90_ms, color: v.name === c.baseline ? other : gpu,
  })));
  const errors = variants.filter((v) => v.error).map((v) => h('li', {}, h('code', {}, v.name), `: ${v.error}`));
  const versions = Object.entries(c.versions || {}).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', ');
  return [section(`Comparison: ${dir === '.' ? 'the logdir' : dir}`,
    h('p', {class: 'meta'}, `${variants.length} variants on ${c.device}; ${settings.steps} timed steps each after `
      + `${settings.warmup} warm-up, interleaved in blocks of ${settings.block} (seed ${settings.seed}). `
      + `Speedup = median(${c.baseline}) / median(variant).`),
    h('table', {id: 'compare'}, h('thead', {}, head), h('tbody', {}, rows)),
    h('figure', {}, chart),
    note('Bars end at the median step time; whiskers span p10 to p90 of the timed steps.'),
    noiseWarning(variants, settings, conf),
    variants.some((v) => v.trace_diff) ? [h('h3', {}, `In the traces, against ${c.baseline} (kprof diff)`),
      h('ul', {class: 'files', id: 'trace-diff'}, variants.filter((v) => v.trace_diff).map((v) =>
        h('li', {}, h('code', {}, v.name), `: ${v.trace_diff}`)))] : null,
    diffLinks(variants, data.runs),
    errors.length ? h('ul', {class: 'problems'}, errors) : null,
    note(`Versions: ${versions}. Click a variant to open its profiled run.`))];
}

/** Links to the diff of the first variant's run against each other variant's run (those that were profiled). */
function diffLinks(variants, runs) {
  const [first, ...others] = variants.filter((v) => runs[v.name]);
  if (!first || !others.length) return null;
  const links = others.map((v) => viewLink(diffView({a: runs[first.name], b: runs[v.name]}), v.name));
  return h('p', {id: 'diff-links'}, `The whole diff of each against ${first.name}: `,
    links.flatMap((link, i) => (i ? [', ', link] : [link])), '.');
}

/**
 * A warning when the measurement cannot resolve the changes the verdict is about: a speedup's confidence interval
 * wider than the noise threshold either way.
 */
function noiseWarning(variants, settings, conf) {
  const threshold = settings.noise_threshold ?? 0.02;
  const noisy = variants.filter((v) => v.ci_low !== null && v.ci_high !== null && v.speedup
    && (v.ci_high - v.ci_low) / 2 / v.speedup > threshold);
  if (!noisy.length) return null;
  const spans = noisy.map((v) => `${v.name}: [${v.ci_low.toFixed(3)}, ${v.ci_high.toFixed(3)}], `
    + `±${(50 * (v.ci_high - v.ci_low) / v.speedup).toFixed(1)}%`);
  return h('p', {class: 'diag warning', id: 'noise'}, h('span', {class: 'badge'}, 'noisy'),
    `The ${conf} of the speedup is wider than the ${(100 * threshold).toFixed(0)}% the verdict treats as noise (`
    + `${spans.join('; ')}): this measurement cannot tell a change that small from noise. Time more steps (--steps), `
    + 'on a quieter machine, or with fewer other processes running.');
}
