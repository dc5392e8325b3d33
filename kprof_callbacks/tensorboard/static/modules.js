// The kprof tab's module view: time by nn.Module as a tree that opens level by level, the source lines with the
// most time, and what ran compiled. Its data comes from the plugin's `modules` route.

import {getJSON, h, ms, note, pct, query, section, shorten, table} from './dom.js';

const COLUMNS = ['forward', 'backward', 'total', 'self', 'share', 'calls'];

/** The section, filled in when the route answers (a view's parts may be lists, or null where it has none). */
export function modulesSection(name) {
  const body = h('div', {class: 'modules'}, note('Loading the module view…'));
  getJSON(`modules?${query({run: name})}`).then(
    (data) => body.replaceChildren(...moduleView(data).flat(Infinity).filter(Boolean)),
    (err) => body.replaceChildren(note(`Could not load the module view: ${err.message}`, 'error')));
  return section('Time by module', body);
}

function moduleView(data) {
  if (!data.tree.length) {
    return [note('No module view: pass model= to kprof.session (the Lightning callback passes its own module).')];
  }
  const what = data.gpu ? 'GPU' : 'host';
  const head = h('div', {class: 'modrow modhead'}, h('span', {class: 'name'}, 'module'),
    COLUMNS.map((c) => h('span', {class: 'num'}, c)));
  return [
    note(`${what} time; a module's time includes its children's. Open a module to see its children.`),
    h('div', {class: 'modtree'}, head, data.tree.map((n) => moduleNode(n, 0))),
    compiledNote(data.compiled),
    linesTable(data.lines, data.gpu),
  ];
}

function moduleNode(n, depth) {
  const cells = h('span', {class: 'modrow'},
    h('span', {class: 'name', title: n.name || '(model)'}, shorten(n.label, 90)),
    [n.forward_us, n.backward_us, n.total_us, n.self_us].map((us) => h('span', {class: 'num'}, ms(us))),
    h('span', {class: 'num'}, pct(n.share)),
    h('span', {class: 'num'}, String(n.calls)));
  if (!n.children.length) return h('div', {class: 'modleaf', 'data-module': n.name}, cells);
  return h('details', {open: depth < 1, 'data-module': n.name},
    h('summary', {}, cells), n.children.map((c) => moduleNode(c, depth + 1)));
}

function compiledNote(compiled) {
  if (!compiled || !compiled.graphs_per_step) return null;
  const breaks = compiled.breaks_per_step;
  const recompiled = compiled.recompiled.length ? `recompiled: ${compiled.recompiled.join(', ')}` : 'no recompilation';
  return note(`Compiled: ${compiled.graphs_per_step} graph(s) a step, ${breaks} graph break(s) a step, ${recompiled}.`
    + compiled.notes.map((n) => ` ${n}`).join(''));
}

function linesTable(lines, gpu) {
  if (!lines.length) return note('No source lines: profile with with_stack=True (eager code) or compile the model.');
  const columns = [
    {label: 'line', get: (r) => shorten(r.line), title: (r) => r.line, keep: true},
    {label: 'pass', get: (r) => r.direction || '-', cls: 'tag', keep: true},
    {label: gpu ? 'GPU time' : 'host time', get: (r) => (gpu ? r.gpu_us : r.cpu_us), fmt: ms, keep: true},
    {label: 'share', get: (r) => r.share, fmt: pct, keep: true},
  ];
  return [h('h3', {}, 'Top source lines'), table(columns, lines)];
}
