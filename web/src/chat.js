// chat.js — the chat page (GET /, docs/web.md): streams replies from /v1/chat/completions, renders
// markdown (marked, sanitized by DOMPurify), keeps conversations in localStorage, and shows per turn
// what the cache did (the response's "kvtier" object, docs/server.md).
import { marked } from 'marked';
import DOMPurify from 'dompurify';
import { apiFetch } from './api.js';
import './style.css';

const STORE = 'kvtier.conversations';
const SETTINGS = 'kvtier.settings';
const $ = (id) => document.getElementById(id);
const TIER = { ram: 'RAM', ssd: 'SSD', shared: 'shared', none: 'none' };

let convs = JSON.parse(localStorage.getItem(STORE) || '[]');
let cur = convs[0] || newConv();
let busy = null; // AbortController of the running request

function newConv() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New chat', messages: [] };
  convs.unshift(c);
  return c;
}
function save() {
  localStorage.setItem(STORE, JSON.stringify(convs));
}

// ---- settings ---------------------------------------------------------------------------------
const FIELDS = ['system', 'temperature', 'max_tokens', 'top_p', 'seed'];
function loadSettings() {
  const s = JSON.parse(localStorage.getItem(SETTINGS) || '{}');
  for (const f of FIELDS) if (s[f] !== undefined) $(f).value = s[f];
}
function saveSettings() {
  const s = {};
  for (const f of FIELDS) s[f] = $(f).value;
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}
function samplingParams() {
  const p = {};
  const num = (f) => ($(f).value === '' ? undefined : Number($(f).value));
  for (const f of ['temperature', 'max_tokens', 'top_p', 'seed']) if (num(f) !== undefined) p[f] = num(f);
  return p;
}

// ---- rendering --------------------------------------------------------------------------------
// model output is untrusted: DOMPurify strips scripts and handlers; an image it leaves gets an
// empty alt when it has none (the model gave no description; the CSP loads none from elsewhere)
DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'IMG' && !node.hasAttribute('alt')) node.setAttribute('alt', '');
});
function md(text) {
  return DOMPurify.sanitize(marked.parse(text || ''));
}

function badge(st) {
  const b = document.createElement('p');
  b.className = 'badge';
  if (!st) return b;
  const tier = TIER[st.reused_from] || st.reused_from;
  b.dataset.reused = st.cached_tokens;
  b.dataset.tier = st.reused_from;
  b.dataset.computed = st.computed_tokens;
  const parts = [
    st.cached_tokens > 0 ? `reused ${st.cached_tokens} tokens from ${tier}` : 'nothing reused',
    `computed ${st.computed_tokens}`,
    `TTFT ${st.ttft_ms.toFixed(1)} ms`,
    `decode ${st.decode_tps.toFixed(1)} tok/s`,
  ];
  b.textContent = parts.join(' · ');
  b.title = 'What the KV cache did for this turn (prompt tokens reused vs computed)';
  if (st.cached_tokens > 0) b.classList.add(`tier-${st.reused_from}`);
  return b;
}

function toolCards(calls) {
  const box = document.createElement('div');
  for (const tc of calls) {
    const card = document.createElement('div');
    card.className = 'toolcard';
    const h = document.createElement('p');
    h.className = 'toolname';
    h.textContent = `tool call: ${tc.function?.name || '?'}`;
    const pre = document.createElement('pre');
    let args = tc.function?.arguments || '';
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* shown as sent */ }
    pre.textContent = args;
    card.append(h, pre);
    box.append(card);
  }
  return box;
}

function renderMessage(m, i) {
  const li = document.createElement('li');
  li.className = `msg ${m.role}`;
  li.dataset.index = i;
  const who = document.createElement('p');
  who.className = 'who';
  who.textContent = m.role === 'user' ? 'You' : 'Assistant';
  li.append(who);
  if (m.reasoning) {
    const d = document.createElement('details');
    d.className = 'reasoning';
    const s = document.createElement('summary');
    s.textContent = 'Reasoning';
    const body = document.createElement('div');
    body.innerHTML = md(m.reasoning);
    d.append(s, body);
    li.append(d);
  }
  const body = document.createElement('div');
  body.className = 'content';
  body.innerHTML = md(m.content);
  li.append(body);
  if (m.tool_calls?.length) li.append(toolCards(m.tool_calls));
  if (m.error) {
    const e = document.createElement('p');
    e.className = 'error';
    e.textContent = m.error;
    li.append(e);
  }
  const tools = document.createElement('div');
  tools.className = 'actions';
  if (m.role === 'user') tools.append(button('Edit', () => startEdit(li, i), `Edit message ${i + 1}`));
  else {
    li.append(badge(m.stats));
    tools.append(button('Regenerate', () => regenerate(i), `Regenerate reply ${i + 1}`));
  }
  li.append(tools);
  return li;
}

function button(label, fn, aria) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  if (aria) b.setAttribute('aria-label', aria);
  b.addEventListener('click', fn);
  return b;
}

function render() {
  const ol = $('messages');
  ol.replaceChildren(...cur.messages.map(renderMessage));
  const ul = $('convs');
  ul.replaceChildren(...convs.map((c) => {
    const li = document.createElement('li');
    const b = button(c.title, () => { if (!busy) { cur = c; render(); } });
    if (c === cur) b.setAttribute('aria-current', 'true');
    const del = button('×', () => {
      if (busy) return;
      convs = convs.filter((x) => x !== c);
      if (cur === c) cur = convs[0] || newConv();
      save();
      render();
    }, `Delete conversation ${c.title}`);
    del.className = 'del';
    li.append(b, del);
    return li;
  }));
  ol.lastElementChild?.scrollIntoView({ block: 'end' });
}

function startEdit(li, i) {
  if (busy) return;
  const content = li.querySelector('.content');
  const ta = document.createElement('textarea');
  ta.value = cur.messages[i].content;
  ta.rows = 3;
  ta.setAttribute('aria-label', `New text of message ${i + 1}`);
  const acts = li.querySelector('.actions');
  acts.replaceChildren(
    button('Save & resend', () => {
      cur.messages[i].content = ta.value;
      cur.messages.length = i + 1; // everything after the edit is recomputed; the prefix is reused
      send();
    }),
    button('Cancel', render));
  content.replaceChildren(ta);
  ta.focus();
}

function regenerate(i) {
  if (busy) return;
  cur.messages.length = i;
  send();
}

// ---- the request --------------------------------------------------------------------------------
// Reads the server-sent events of a streamed completion, calling onEvent with each parsed JSON.
async function readSSE(resp, onEvent) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, at);
      buf = buf.slice(at + 2);
      for (const line of ev.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function send() {
  const msgs = [];
  const sys = $('system').value.trim();
  if (sys) msgs.push({ role: 'system', content: sys });
  for (const m of cur.messages) {
    const o = { role: m.role, content: m.content };
    if (m.tool_calls?.length) o.tool_calls = m.tool_calls;
    msgs.push(o);
  }
  if (cur.title === 'New chat' && cur.messages[0]) cur.title = cur.messages[0].content.slice(0, 40);
  const reply = { role: 'assistant', content: '', reasoning: '', tool_calls: [] };
  cur.messages.push(reply);
  render();
  const li = $('messages').lastElementChild;
  const body = li.querySelector('.content');
  busy = new AbortController();
  $('send').hidden = true;
  $('stop').hidden = false;
  $('status').textContent = 'generating…';
  let pending = false;
  const paint = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; body.innerHTML = md(reply.content); });
  };
  try {
    const r = await apiFetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: msgs, stream: true, stream_options: { include_usage: true }, ...samplingParams() }),
      signal: busy.signal,
    });
    if (!r.ok) {
      const e = await r.json().catch(() => ({}));
      throw new Error(e.error?.message || `HTTP ${r.status}`);
    }
    await readSSE(r, (ev) => {
      if (ev.error) throw new Error(ev.error.message);
      if (ev.kvtier) reply.stats = ev.kvtier;
      const d = ev.choices?.[0]?.delta;
      if (!d) return;
      if (d.content) reply.content += d.content;
      if (d.reasoning_content) reply.reasoning += d.reasoning_content;
      for (const tc of d.tool_calls || []) {
        const t = (reply.tool_calls[tc.index] ||= { id: tc.id, type: 'function', function: { name: '', arguments: '' } });
        if (tc.function?.name) t.function.name += tc.function.name;
        if (tc.function?.arguments) t.function.arguments += tc.function.arguments;
      }
      paint();
    });
    $('status').textContent = '';
  } catch (e) {
    reply.error = e.name === 'AbortError' ? 'stopped' : String(e.message || e);
    $('status').textContent = '';
  } finally {
    busy = null;
    $('send').hidden = false;
    $('stop').hidden = true;
    if (!reply.reasoning) delete reply.reasoning;
    if (!reply.tool_calls.length) delete reply.tool_calls;
    save();
    render();
  }
}

function submit() {
  const text = $('prompt').value;
  if (busy || !text.trim()) return;
  $('prompt').value = '';
  cur.messages.push({ role: 'user', content: text });
  send();
}

// ---- wiring -------------------------------------------------------------------------------------
loadSettings();
for (const f of FIELDS) $(f).addEventListener('change', saveSettings);
$('send').addEventListener('click', submit);
$('stop').addEventListener('click', () => busy?.abort());
$('prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    submit();
  }
});
$('newchat').addEventListener('click', () => {
  if (busy) return;
  cur = convs.find((c) => c.messages.length === 0) || newConv();
  save();
  render();
});
render();
apiFetch('/v1/models').then((r) => r.json()).then((j) => { $('model').textContent = j.data?.[0]?.id || ''; }).catch(() => {});
