// The tab's small helpers, shared by its pages (index.js, diff.js): elements, JSON fetches, numbers, tables.

import {num} from './charts.js';
import {duration} from './fmt.js';

export {duration, level} from './fmt.js';

export const TOP = 15; // rows a table shows

/** An HTML element with attributes (`on*` are listeners) and children (strings become text, never HTML). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export async function getJSON(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: ${response.status} ${(await response.text()).trim()}`);
  return response.json();
}

export const query = (params) => new URLSearchParams(params).toString();
export const ms = duration; // every duration in the tab is written as the text reports write it (fmt.js)
export const pct = (share) => `${(100 * share).toFixed(1)}%`;
export const mb = (bytes) => `${num(bytes / 2 ** 20)} MB`;
export const shorten = (text, max = 140) => (text.length > max ? `${text.slice(0, max - 1)}…` : text);

export function section(title, ...body) {
  return h('section', {}, h('h2', {}, title), ...body);
}

export function note(text, cls = 'note') {
  return h('p', {class: cls}, text);
}

const cellClass = (column) => column.cls || (column.fmt ? 'num' : 'name');

/**
 * A table of `rows` (at most `limit`); `columns` are {label, get, fmt, cls, title}: `fmt` may return an element.
 * Columns whose values are all zero are left out unless `keep` is set (GPU columns on a CPU run say nothing). A
 * `compact` table is only as wide as its numbers; `rowClass(row)` gives a row its class.
 */
export function table(columns, rows, limit = TOP, cls = null, rowClass = null) {
  const shown = columns.filter((c) => c.keep || rows.some((r) => c.get(r)));
  const body = rows.slice(0, limit).map((r) => h('tr', {class: rowClass && rowClass(r)}, shown.map((c) => {
    const value = c.get(r);
    const text = c.fmt ? c.fmt(value) : String(value ?? '');
    return h('td', {class: cellClass(c), title: c.title ? c.title(r) : null}, text);
  })));
  const head = h('tr', {}, shown.map((c) => h('th', {class: cellClass(c)}, c.label)));
  const more = rows.length > limit ? note(`Top ${limit} of ${rows.length}.`) : null;
  return [h('table', {class: cls}, h('thead', {}, head), h('tbody', {}, body)), more];
}

/** Consecutive runs of step numbers, as [[first, last], ...]: the profiled windows. */
export function windowsOf(numbers) {
  const sorted = [...new Set(numbers)].filter((n) => n >= 0).sort((a, b) => a - b);
  const out = [];
  for (const n of sorted) {
    if (out.length && n === out[out.length - 1][1] + 1) out[out.length - 1][1] = n;
    else out.push([n, n]);
  }
  return out;
}
