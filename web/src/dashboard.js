// dashboard.js — the live cache dashboard (GET /dashboard, docs/web.md): polls /stats once a second
// and charts the last five minutes with uPlot (counters become per-second rates between polls), and
// lists the largest cached prefixes from /admin/cache/prefixes every 5 seconds.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { apiFetch } from './api.js';
import './style.css';

const PERIOD_MS = 1000;
const KEEP = 300; // points: 5 minutes
const $ = (id) => document.getElementById(id);
const get = (o, path) => path.split('.').reduce((v, k) => (v == null ? null : v[k]), o);
const MiB = 1024 * 1024;

// Each chart: a title, a unit and its series, each a function of (stats now, stats before, seconds).
const rate = (path) => (s, p, dt) => (p && get(s, path) != null ? Math.max(0, get(s, path) - get(p, path)) / dt : null);
const CHARTS = [
  { id: 'tiers', title: 'Tier bytes (MiB)', series: [
    ['RAM tier', (s) => get(s, 'prompt_cache.bytes') / MiB],
    ['SSD tier', (s) => (s.ssd_cache ? get(s, 'ssd_cache.bytes') / MiB : null)],
    ['KV pool in use', (s) => get(s, 'kv.pool_used_bytes') / MiB]] },
  { id: 'shared', title: 'Shared tier (KiB/s)', series: [
    ['fetched', (s, p, dt) => (s.shared_cache ? rate('shared_cache.fetched_bytes')(s, p, dt) / 1024 : null)],
    ['published', (s, p, dt) => (s.shared_cache ? rate('shared_cache.published_bytes')(s, p, dt) / 1024 : null)]] },
  { id: 'hits', title: 'RAM tier hit ratio (since start)', range: [0, 1], series: [
    ['hit ratio', (s) => {
      const h = get(s, 'prompt_cache.hits'), m = get(s, 'prompt_cache.misses');
      return h + m > 0 ? h / (h + m) : null;
    }]] },
  { id: 'tokens', title: 'Prompt tokens (per second)', series: [
    ['reused', rate('requests.cached_tokens')],
    ['computed', (s, p, dt) => (p ? Math.max(0, (get(s, 'requests.prompt_tokens') - get(s, 'requests.cached_tokens')) -
      (get(p, 'requests.prompt_tokens') - get(p, 'requests.cached_tokens'))) / dt : null)]] },
  { id: 'rates', title: 'Prefill and decode (tok/s, 1 min)', series: [
    ['prefill', (s) => get(s, 'batching.prefill_tokens_per_s_1m')],
    ['decode', (s) => get(s, 'batching.decode_tokens_per_s_1m')]] },
  { id: 'batch', title: 'Batch rows and queue', series: [
    ['rows active', (s) => get(s, 'batching.rows_active')],
    ['rows queued', (s) => get(s, 'batching.rows_queued')],
    ['requests queued', (s) => get(s, 'requests.queued')]] },
  { id: 'flush', title: 'Checkpoints and SSD flush', series: [
    ['checkpoints written', (s) => get(s, 'generation_checkpoints.written')],
    ['checkpoints pending', (s) => get(s, 'generation_checkpoints.pending')],
    ['SSD blocks pending', (s) => get(s, 'ssd_cache.pending_blocks')],
    ['SSD dirty records', (s) => get(s, 'ssd_cache.dirty_records')]] },
];
const COLORS = ['#1f6feb', '#c2410c', '#15803d', '#7c3aed'];

const data = CHARTS.map((c) => [[], ...c.series.map(() => [])]);
const plots = [];

function makeCharts() {
  const box = $('charts');
  CHARTS.forEach((c, i) => {
    const fig = document.createElement('figure');
    fig.className = 'chart';
    fig.id = `chart-${c.id}`;
    fig.dataset.points = '0';
    const cap = document.createElement('figcaption');
    cap.textContent = c.title;
    fig.append(cap);
    box.append(fig);
    plots.push(new uPlot({
      width: Math.max(300, fig.clientWidth - 8),
      height: 180,
      series: [{}, ...c.series.map(([label], k) => ({ label, stroke: COLORS[k], width: 2, spanGaps: false }))],
      axes: [{ space: 90, values: (u, ticks) => ticks.map((t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false })) },
        { size: 60 }],
      scales: { x: { time: true }, ...(c.range ? { y: { range: c.range } } : {}) },
    }, data[i], fig));
  });
}

const NOW = [
  ['RAM tier', (s) => `${(get(s, 'prompt_cache.bytes') / MiB).toFixed(1)} MiB, ${get(s, 'prompt_cache.entries')} entries`],
  ['SSD tier', (s) => (s.ssd_cache ? `${(get(s, 'ssd_cache.bytes') / MiB).toFixed(1)} MiB, ${get(s, 'ssd_cache.entries')} entries` : 'off')],
  ['Shared tier', (s) => (s.shared_cache ? `fetch ${s.shared_cache.fetch_breaker}, publish ${s.shared_cache.publish_breaker}` : 'off')],
  ['Generations', (s) => `${get(s, 'requests.generations')}`],
  ['Prompt tokens', (s) => `${get(s, 'requests.prompt_tokens')} (${get(s, 'requests.cached_tokens')} reused)`],
  ['Checkpoints', (s) => (s.generation_checkpoints ? `${s.generation_checkpoints.written} written, ${s.generation_checkpoints.pending} pending` : 'off')],
];

let prev = null, prevT = 0;
async function poll() {
  try {
    const r = await apiFetch('/stats');
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const s = await r.json();
    const t = Date.now();
    const dt = prev ? (t - prevT) / 1000 : 1;
    $('model').textContent = s.model || '';
    CHARTS.forEach((c, i) => {
      const d = data[i];
      d[0].push(t / 1000);
      c.series.forEach(([, f], k) => {
        const v = f(s, prev, dt);
        d[k + 1].push(v == null || !Number.isFinite(v) ? null : v);
      });
      if (d[0].length > KEEP) d.forEach((col) => col.shift());
      plots[i].setData(d);
      const fig = plots[i].root.parentElement; // what the chart holds, for tests and scripts
      fig.dataset.points = String(d[0].length);
      fig.dataset.last = JSON.stringify(d.slice(1).map((col) => col[col.length - 1]));
      fig.dataset.max = JSON.stringify(d.slice(1).map((col) => Math.max(0, ...col.filter((v) => v != null))));
    });
    $('now').replaceChildren(...NOW.map(([k, f]) => {
      const div = document.createElement('div');
      const dt_ = document.createElement('dt');
      dt_.textContent = k;
      const dd = document.createElement('dd');
      dd.textContent = f(s);
      div.append(dt_, dd);
      return div;
    }));
    $('chart-shared').querySelector('figcaption').textContent = `${CHARTS[1].title}${s.shared_cache ? '' : ': off'}`;
    prev = s;
    prevT = t;
    $('status').textContent = `updated ${new Date(t).toLocaleTimeString()}; charts keep the last 5 minutes`;
  } catch (e) {
    $('status').textContent = `cannot read /stats: ${e.message}`;
  }
  setTimeout(poll, PERIOD_MS);
}

// The admin table of the largest cached prefixes (GET /admin/cache/prefixes), every 5 seconds.
const PREFIX_PERIOD_MS = 5000;
const size = (b) => (b >= MiB ? `${(b / MiB).toFixed(1)} MiB` : `${(b / 1024).toFixed(1)} KiB`);
async function pollPrefixes() {
  try {
    const r = await apiFetch('/admin/cache/prefixes?limit=20');
    if (r.status === 403) throw new Error('admin only: this API key may not list cached prefixes');
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const j = await r.json();
    $('prefixes').querySelector('tbody').replaceChildren(...j.data.map((p) => {
      const tr = document.createElement('tr');
      for (const v of [p.tokens, size(p.bytes), `${p.idle_s.toFixed(0)} s`, p.root.slice(0, 8), p.head]) {
        const td = document.createElement('td');
        td.textContent = String(v); // model and user text: never markup
        tr.append(td);
      }
      return tr;
    }));
    $('prefixes').dataset.rows = String(j.data.length);
    $('prefixes-status').textContent = `${j.total} cached prefixes in the RAM tier; the ${j.data.length} longest:`;
  } catch (e) {
    $('prefixes-status').textContent = `cannot list cached prefixes: ${e.message}`;
  }
  setTimeout(pollPrefixes, PREFIX_PERIOD_MS);
}

makeCharts();
pollPrefixes();
window.addEventListener('resize', () => plots.forEach((p) => p.setSize({ width: Math.max(300, p.root.parentElement.clientWidth - 8), height: 180 })));
poll();
