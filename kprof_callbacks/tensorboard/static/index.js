// The kprof tab. TensorBoard loads this ES module in the tab's iframe and calls render(); every request
// goes to this plugin's routes (relative URLs under data/plugin/kprof/), nothing to the network.

import {lineChart, median, num, rangeBars, stackedBars} from './charts.js';

const TOP = 15;
const state = {runs: [], comparisons: [], logdir: '', view: null};

/** An HTML element with attributes (`on*` are listeners) and children (strings become text, never HTML). */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

async function getJSON(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: ${response.status} ${(await response.text()).trim()}`);
  return response.json();
}

const query = (params) => new URLSearchParams(params).toString();
const ms = (us) => `${num(us / 1000)} ms`;
const pct = (share) => `${(100 * share).toFixed(1)}%`;
const mb = (bytes) => `${num(bytes / 2 ** 20)} MB`;
const shorten = (text, max = 140) => (text.length > max ? `${text.slice(0, max - 1)}…` : text);

function section(title, ...body) {
  return h('section', {}, h('h2', {}, title), ...body);
}

function note(text, cls = 'note') {
  return h('p', {class: cls}, text);
}

/**
 * A table of `rows` (at most `limit`); `columns` are {label, get, fmt, cls, title}. Columns whose values
 * are all zero are left out unless `keep` is set (GPU columns on a CPU run say nothing). A `compact`
 * table is only as wide as its numbers.
 */
function table(columns, rows, limit = TOP, cls = null) {
  const shown = columns.filter((c) => c.keep || rows.some((r) => c.get(r)));
  const body = rows.slice(0, limit).map((r) => h('tr', {}, shown.map((c) => {
    const value = c.get(r);
    const text = c.fmt ? c.fmt(value) : String(value ?? '');
    return h('td', {class: c.cls || (c.fmt ? 'num' : 'name'), title: c.title ? c.title(r) : null}, text);
  })));
  const head = h('tr', {}, shown.map((c) => h('th', {class: c.fmt ? 'num' : 'name'}, c.label)));
  const more = rows.length > limit ? note(`Top ${limit} of ${rows.length}.`) : null;
  return [h('table', {class: cls}, h('thead', {}, head), h('tbody', {}, body)), more];
}

// -- page skeleton ------------------------------------------------------------------------------------------
const picker = h('select', {id: 'picker', 'aria-label': 'run', onchange: () => select(picker.value)});
const status = h('span', {id: 'status', class: 'status'});
const main = h('main', {id: 'content'});

export async function render() {
  document.head.append(h('link', {rel: 'stylesheet', href: 'style.css'}), h('title', {}, 'kprof'));
  document.body.append(h('div', {class: 'wrap'},
    h('header', {},
      h('h1', {}, 'kprof'),
      h('label', {}, 'Run ', picker),
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
  Object.assign(state, {runs: listing.runs, comparisons: listing.comparisons, logdir: listing.logdir});
  if (!state.runs.length && !state.comparisons.length) {
    status.textContent = '';
    picker.replaceChildren();
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
  picker.replaceChildren(...options);
  const wanted = state.view || decodeURIComponent(location.hash.slice(1));
  const values = [...picker.querySelectorAll('option')].map((o) => o.value);
  await select(values.includes(wanted) ? wanted : latestView());
}

/** The run or comparison written last: after `kprof.compare` that is the comparison, else the newest run. */
function latestView() {
  const items = [
    ...state.runs.map((r) => ({view: `run=${r.run}`, modified: r.modified})),
    ...state.comparisons.map((c) => ({view: `compare=${c.dir}`, modified: c.modified})),
  ];
  return items.reduce((a, b) => (b.modified > a.modified ? b : a)).view;
}

async function select(view) {
  state.view = view;
  picker.value = view;
  history.replaceState(null, '', `#${encodeURIComponent(view)}`);
  const [kind, name] = [view.slice(0, view.indexOf('=')), view.slice(view.indexOf('=') + 1)];
  status.textContent = `Loading ${name}…`;
  try {
    main.replaceChildren(...(kind === 'compare' ? await comparePage(name) : await runPage(name)));
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
    h('p', {}, 'then start ', h('code', {}, 'tensorboard --logdir log'),
      ' again (or press Reload). In a terminal, ', h('code', {}, 'kprof summary log'), ' prints the same summary.'));
}

// -- one run --------------------------------------------------------------------------------------------------
async function runPage(name) {
  const [data, steptime] = await Promise.all([
    getJSON(`summary?${query({run: name})}`),
    getJSON(`steptime?${query({run: name})}`),
  ]);
  const s = data.summary;
  const files = data.files;
  const when = new Date(data.summarized_at * 1000).toLocaleTimeString();
  const parts = [
    h('p', {class: 'meta'}, `${files.traces.length} trace file${files.traces.length === 1 ? '' : 's'}, ${mb(files.bytes)}; `
      + `summarized in ${num(data.seconds)} s at ${when}` + (s && s.ranks.length > 1 ? `; ${s.ranks.length} ranks` : '')),
  ];
  if (data.error) parts.push(note(data.error, 'error'));
  if (data.problems.length) parts.push(problemsSection(data.problems));
  if (s) {
    parts.push(diagnosticsSection(s.diagnostics));
  }
  parts.push(stepTimeSection(steptime.points));
  if (s) {
    const gpu = s.kernels.length > 0;
    parts.push(stepsSection(s.steps, gpu), opsSection(s.ops, gpu));
    if (gpu) parts.push(kernelsSection(s.kernels));
    parts.push(labelsSection(s.labels, gpu));
    if (s.ranks.length > 1) parts.push(ranksSection(s.ranks, s.step_skew));
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

function stepTimeSection(points) {
  if (!points.length) {
    return section('Step time over the run', note('No kprof/step_time_ms scalars for this run yet: the session writes '
      + 'them every 50 steps and at exit, and TensorBoard picks them up on its next reload (a few seconds).'));
  }
  const values = points.map((p) => p[1]);
  const last = values[values.length - 1];
  return section('Step time over the run',
    h('figure', {}, lineChart(points)),
    note(`${points.length} steps; median ${num(median(values))} ms, min ${num(Math.min(...values))} ms, `
      + `max ${num(Math.max(...values))} ms, last ${num(last)} ms (every step, not only the profiled ones).`));
}

function stepsSection(steps, gpu) {
  const workers = new Set(steps.map((r) => r.worker)).size;
  const label = (r) => (workers > 1 ? `${r.rank ?? r.worker} #${r.step}` : `step ${r.step}`);
  const rows = steps.map((r) => {
    const busy = gpu ? r.gpu_busy_us : 0;
    return {label: label(r), parts: [
      {value: busy / 1000, cls: 'seg-gpu', name: 'GPU busy'},
      {value: r.cpu_only_us / 1000, cls: 'seg-host', name: gpu ? 'host only, GPU idle' : 'host operators'},
      {value: Math.max(r.wall_us - busy - r.cpu_only_us, 0) / 1000, cls: 'seg-other', name: 'neither (Python, waits)'},
    ]};
  });
  const legend = h('p', {class: 'legend'},
    gpu ? [h('span', {class: 'swatch seg-gpu'}), 'GPU busy '] : null,
    h('span', {class: 'swatch seg-host'}), gpu ? 'host only, GPU idle ' : 'host operators ',
    h('span', {class: 'swatch seg-other'}), 'neither (Python, waits)');
  const columns = [
    {label: 'step', get: (r) => r.step, cls: 'num', keep: true},
    {label: 'rank / worker', get: (r) => (workers > 1 ? (r.rank ?? r.worker) : null), cls: 'name'},
    {label: 'wall', get: (r) => r.wall_us, fmt: ms, keep: true},
    {label: 'GPU busy', get: (r) => r.gpu_busy_us, fmt: ms},
    {label: 'kernels', get: (r) => r.kernel_us, fmt: ms},
    {label: 'memcpy', get: (r) => r.memcpy_us, fmt: ms},
    {label: 'memset', get: (r) => r.memset_us, fmt: ms},
    {label: 'comm', get: (r) => r.comm_us, fmt: ms},
    {label: gpu ? 'host only' : 'host ops', get: (r) => r.cpu_only_us, fmt: ms},
    {label: 'data loading', get: (r) => r.dataloader_us, fmt: ms},
    {label: 'GPU idle', get: (r) => r.gpu_idle_us, fmt: ms},
    {label: 'peak memory', get: (r) => r.peak_memory, fmt: mb},
  ];
  return section('Per-step breakdown', h('figure', {}, stackedBars(rows)), legend, table(columns, steps, 64, 'compact'));
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
  const columns = [
    {label: 'label', get: (r) => shorten(r.name), title: (r) => r.name, keep: true},
    {label: 'count', get: (r) => r.count, fmt: String, keep: true},
    {label: 'total', get: (r) => r.total_us, fmt: ms, keep: true},
    {label: 'mean', get: (r) => r.mean_us, fmt: ms, keep: true},
    {label: 'GPU time', get: (r) => (gpu ? r.cuda_total_us : 0), fmt: ms},
    {label: 'share of steps', get: (r) => r.step_share, fmt: pct, keep: true},
  ];
  return section('Labels (regions)', table(columns, labels));
}

function ranksSection(ranks, skew) {
  const columns = [
    {label: 'rank / worker', get: (r) => r.rank ?? r.worker, cls: 'name', keep: true},
    {label: 'steps', get: (r) => r.steps, fmt: String, keep: true},
    {label: 'step', get: (r) => r.step_us, fmt: ms, keep: true},
    {label: 'compute', get: (r) => r.compute_us, fmt: ms, keep: true},
    {label: 'comm', get: (r) => r.comm_us, fmt: ms, keep: true},
    {label: 'comm share', get: (r) => r.comm_share, fmt: pct, keep: true},
    {label: 'overlapped', get: (r) => r.overlap_share, fmt: pct, keep: true},
    {label: 'exposed comm', get: (r) => r.exposed_comm_us, fmt: ms, keep: true},
  ];
  const skewColumns = [
    {label: 'step', get: (r) => r.step, cls: 'num', keep: true},
    {label: 'slowest rank', get: (r) => r.slowest_rank, cls: 'num', keep: true},
    {label: 'its compute', get: (r) => r.slowest_compute_us, fmt: ms, keep: true},
    {label: 'median compute', get: (r) => r.median_compute_us, fmt: ms, keep: true},
    {label: 'lag', get: (r) => r.lag_us, fmt: ms, keep: true},
  ];
  return section('Ranks (means per step)', table(columns, ranks, 64, 'compact'),
    skew.length ? [h('h3', {}, 'Slowest rank per step'), table(skewColumns, skew, 64, 'compact')] : null);
}

function tracesSection(name, files, snapshots) {
  const rows = files.traces.map((f) => h('li', {},
    h('a', {href: `trace?${query({run: name, file: f.name})}`, download: f.name}, f.name), ` (${mb(f.bytes)})`));
  const pending = files.partial.length
    ? note(`${files.partial.length} file(s) still being written (*.partial) are not shown yet; press Reload when they land.`)
    : null;
  const perfetto = h('p', {},
    'To see the timeline: download a trace, open ',
    h('a', {href: 'https://ui.perfetto.dev', target: '_blank', rel: 'noopener noreferrer'}, 'ui.perfetto.dev'),
    ', choose "Open trace file" and pick the downloaded file (.json and .json.gz both open; the file stays on '
    + 'your machine). chrome://tracing reads the same files.');
  const memory = snapshots.length
    ? note(`CUDA memory snapshots beside the traces: ${snapshots.map((p) => p.split('/').pop()).join(', ')} `
      + '(drag one onto pytorch.org/memory_viz).')
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
  const conf = settings.confidence ? `${Math.round(100 * settings.confidence)}% CI` : 'CI';
  const check = (v) => {
    if (v.check_ok === null || v.check_ok === undefined) return v.name === c.baseline ? 'reference' : 'not checked';
    if (v.check_ok) return `ok (max rel err ${v.check_max_rel_err.toExponential(1)})`;
    return `FAILED at ${v.check_worst} (tol ${v.check_tol.toExponential(0)})`;
  };
  const runLink = (v) => (data.runs[v.name]
    ? h('a', {href: `#run=${encodeURIComponent(data.runs[v.name])}`, onclick: (e) => {
      e.preventDefault();
      select(`run=${data.runs[v.name]}`);
    }}, v.name)
    : v.name);
  const rows = variants.map((v) => h('tr', {class: v.status === 'ok' ? '' : 'failed'},
    h('td', {class: 'name'}, runLink(v)),
    h('td', {class: 'num'}, v.median_ms === null ? '–' : `${num(v.median_ms)} ms`),
    h('td', {class: 'num'}, v.p10_ms === null ? '–' : `${num(v.p10_ms)}–${num(v.p90_ms)} ms`),
    h('td', {class: 'num'}, v.speedup === null ? '–'
      : `${v.speedup.toFixed(2)}x` + (v.ci_low === null ? '' : ` [${v.ci_low.toFixed(2)}, ${v.ci_high.toFixed(2)}]`)),
    h('td', {class: 'name'}, v.verdict || v.status),
    h('td', {class: `name ${v.check_ok === false ? 'bad' : ''}`}, check(v)),
    h('td', {class: 'num'}, v.peak_mem_mb === null ? '–' : `${num(v.peak_mem_mb)} MB`)));
  const head = h('tr', {}, ['variant', 'median', 'p10–p90', `speedup [${conf}]`, 'verdict', 'correctness check', 'peak memory']
    .map((t, i) => h('th', {class: [0, 4, 5].includes(i) ? 'name' : 'num'}, t)));
  const chart = rangeBars(variants.map((v) => ({
    label: v.name, median: v.median_ms, low: v.p10_ms, high: v.p90_ms, cls: v.name === c.baseline ? 'seg-other' : 'seg-gpu',
  })));
  const errors = variants.filter((v) => v.error).map((v) => h('li', {}, h('code', {}, v.name), `: ${v.error}`));
  const versions = Object.entries(c.versions || {}).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', ');
  return [section(`Comparison: ${dir === '.' ? 'the logdir' : dir}`,
    h('p', {class: 'meta'}, `${variants.length} variants on ${c.device}; ${settings.steps} timed steps each after `
      + `${settings.warmup} warm-up, interleaved in blocks of ${settings.block} (seed ${settings.seed}). `
      + `Speedup = median(${c.baseline}) / median(variant).`),
    h('table', {id: 'compare'}, h('thead', {}, head), h('tbody', {}, rows)),
    h('figure', {}, chart),
    errors.length ? h('ul', {class: 'problems'}, errors) : null,
    note(`Versions: ${versions}. Click a variant to open its profiled run.`))];
}
