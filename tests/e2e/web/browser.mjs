// browser.mjs URL KEY OUTDIR — drives the chat page and the dashboard (docs/web.md) in headless
// Debian chromium through puppeteer-core, against a `kvtier serve --api-key KEY` at URL (tests/e2e/web.sh):
// two turns, an edit of turn 1, a regenerate; each turn's cache badge is checked against the deltas
// of /stats; a stored turn with reasoning, a tool call, code and hostile HTML renders (reasoning
// folded, the call as a card, markdown and code) with the HTML sanitized; the dashboard's charts
// must gain points and show the reused tokens of a new request; axe-core finds no serious or critical violation on either page; screenshots go to OUTDIR.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import puppeteer from 'puppeteer-core';

const [url, key, outdir] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const axeSrc = fs.readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const fail = (msg) => { throw new Error(msg); };
const ok = (msg) => console.log(`ok: ${msg}`);

async function stats() {
  const r = await fetch(`${url}/stats`, { headers: { Authorization: `Bearer ${key}` } });
  if (!r.ok) fail(`/stats: HTTP ${r.status}`);
  return r.json();
}

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
});
const problems = [];
let hostile = false;
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 860 });
  page.on('console', (m) => {
    // the page's own 401 (before the key is entered) is expected; anything else (a CSP refusal, an
    // exception) is a failure
    if (m.type() !== 'error' || /status of 401/.test(m.text())) return;
    // while the hostile turn below is shown, the CSP refusing its inline handler is the defence
    // working (DOMPurify's parse of it in an inert document trips the policy; nothing runs)
    if (hostile && /inline event handler/.test(m.text())) return;
    problems.push(`${m.text()} [${page.url()} ${JSON.stringify(m.location())}]`);
  });
  page.on('pageerror', (e) => problems.push(String(e)));

  async function axe(name) {
    await page.evaluate(axeSrc); // evaluated through the DevTools protocol: the page's CSP allows no inline script
    const res = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
    const bad = res.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    for (const v of res.violations) console.log(`axe ${name}: ${v.impact} ${v.id}: ${v.help} (${v.nodes.length} nodes)`);
    if (bad.length) fail(`axe: ${bad.length} serious/critical violations on ${name}`);
    ok(`axe-core: no serious or critical violation on ${name} (${res.violations.length} minor)`);
  }

  // ---- chat: the page loads without the key, then asks for it once (GET /v1/models answers 401)
  await page.goto(`${url}/`, { waitUntil: 'load' });
  await page.waitForSelector('#keydlg[open]', { timeout: 10000 });
  await page.type('#keyinput', key);
  await page.click('#keyok');
  await page.waitForFunction(() => document.getElementById('model').textContent !== '', { timeout: 10000 });
  ok('the chat page asked for the API key and then listed the model');

  for (const [id, v] of [['temperature', '0'], ['max_tokens', '24'], ['seed', '7']]) {
    await page.$eval(`#${id}`, (el, v) => { el.value = v; el.dispatchEvent(new Event('change')); }, v);
  }

  // one turn: type or edit, wait for the badge of the reply at li index `at`, compare with /stats
  async function turn(at, action, label) {
    const before = await stats();
    await action();
    await page.waitForSelector(`#messages li[data-index="${at}"] .badge[data-tier]`, { timeout: 120000 });
    const b = await page.$eval(`#messages li[data-index="${at}"] .badge`, (el) => ({
      reused: Number(el.dataset.reused), computed: Number(el.dataset.computed), tier: el.dataset.tier, text: el.textContent }));
    const after = await stats();
    const dReused = after.requests.cached_tokens - before.requests.cached_tokens;
    const dPrompt = after.requests.prompt_tokens - before.requests.prompt_tokens;
    if (b.reused !== dReused) fail(`${label}: badge says ${b.reused} reused, /stats counted ${dReused}`);
    if (b.reused + b.computed !== dPrompt) fail(`${label}: badge says ${b.reused}+${b.computed} prompt tokens, /stats counted ${dPrompt}`);
    const hits = after.prompt_cache.hits - before.prompt_cache.hits;
    if ((b.tier === 'ram') !== (hits > 0)) fail(`${label}: badge tier ${b.tier} but /stats counted ${hits} RAM hits`);
    ok(`${label}: "${b.text}" matches /stats (+${dReused} reused of +${dPrompt}, ${hits} RAM hits)`);
    return b;
  }
  const send = (text) => async () => {
    await page.type('#prompt', text);
    await page.click('#send');
  };

  const t1 = await turn(1, send('In the beginning God created'), 'turn 1');
  const t2 = await turn(3, send('And the earth was without form'), 'turn 2');
  if (!(t2.reused > 0 && t2.tier === 'ram')) fail(`turn 2 reused ${t2.reused} from ${t2.tier}: expected the RAM tier`);
  if (t2.reused < t1.reused + t1.computed - 1) fail(`turn 2 reused ${t2.reused}: less than turn 1's prompt (${t1.reused + t1.computed})`);
  ok(`turn 2 reused ${t2.reused} tokens from RAM (turn 1's prompt was ${t1.reused + t1.computed})`);
  await page.screenshot({ path: `${outdir}/web-chat-turns.png` });

  // edit turn 1: everything up to the edit is reused, the rest recomputed
  const t3 = await turn(1, async () => {
    await page.click('#messages li[data-index="0"] .actions button');
    await page.waitForSelector('#messages li[data-index="0"] textarea');
    await page.type('#messages li[data-index="0"] textarea', ' the heaven');
    await page.click('#messages li[data-index="0"] .actions button');
    await page.waitForFunction(() => document.querySelectorAll('#messages li').length === 2);
  }, 'edit of turn 1');
  const p1 = t1.reused + t1.computed;
  if (!(t3.reused > 0 && t3.reused < p1)) fail(`edit reused ${t3.reused}: expected the prefix before the edit (0 < n < ${p1})`);
  if (t3.tier !== 'ram') fail(`edit reused from ${t3.tier}, expected ram`);
  ok(`the edit reused ${t3.reused} tokens up to the edit and computed ${t3.computed}`);
  const n = await page.$$eval('#messages li', (l) => l.length);
  if (n !== 2) fail(`after the edit the conversation has ${n} messages, expected 2`);

  const t4 = await turn(1, () => page.click('#messages li[data-index="1"] .actions button'), 'regenerate');
  if (t4.reused < t3.reused + t3.computed - 1) fail(`regenerate reused ${t4.reused} of ${t3.reused + t3.computed}`);

  // the conversation and the key survive a reload (localStorage); no second key prompt
  await page.reload({ waitUntil: 'load' });
  await page.waitForSelector('#messages li[data-index="1"] .badge[data-tier]');
  if (await page.$('#keydlg[open]')) fail('the key was asked for again after a reload');
  ok('the conversation and the key survive a reload');
  await page.screenshot({ path: `${outdir}/web-chat.png` });
  await axe('the chat page');

  // a stored conversation with reasoning, a tool call, markdown with code, and hostile HTML: the
  // reasoning is folded, the call is a card, the code a <pre><code>, the HTML sanitized
  hostile = true;
  await page.evaluate(() => {
    const convs = JSON.parse(localStorage.getItem('kvtier.conversations'));
    convs.unshift({ id: 'rich', title: 'rendering', messages: [
      { role: 'user', content: 'What is the weather in **Paris**?' },
      { role: 'assistant', content: 'Looking it up:\n\n```js\nconst x = 1;\n```\n\n<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>',
        reasoning: 'The user wants the weather.', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
        stats: { reused_from: 'ssd', cached_tokens: 256, computed_tokens: 12, ttft_ms: 40.5, prefill_tps: 300, decode_tps: 90 } }] });
    localStorage.setItem('kvtier.conversations', JSON.stringify(convs));
  });
  await page.reload({ waitUntil: 'load' });
  await page.waitForSelector('#messages li[data-index="1"]');
  const rich = await page.evaluate(() => ({
    folded: !!document.querySelector('li[data-index="1"] details.reasoning:not([open])'),
    card: document.querySelector('li[data-index="1"] .toolcard')?.textContent || '',
    code: document.querySelector('li[data-index="1"] .content pre code')?.textContent || '',
    bold: document.querySelector('li[data-index="0"] .content strong')?.textContent || '',
    handler: !!document.querySelector('#messages [onerror]') || !!document.querySelector('#messages script'),
    pwned: window.pwned,
    badge: document.querySelector('li[data-index="1"] .badge')?.textContent || '',
  }));
  if (!rich.folded) fail('reasoning_content is not shown folded');
  if (!/get_weather/.test(rich.card) || !/"city": "Paris"/.test(rich.card)) fail(`tool call card: ${rich.card}`);
  if (rich.code.trim() !== 'const x = 1;' || rich.bold !== 'Paris') fail(`markdown: code '${rich.code}', bold '${rich.bold}'`);
  if (rich.handler || rich.pwned) fail('model HTML was not sanitized');
  if (!/reused 256 tokens from SSD/.test(rich.badge)) fail(`badge of an SSD reuse: ${rich.badge}`);
  ok('reasoning folded, tool call as a card, markdown and code rendered, model HTML sanitized, SSD badge');
  await axe('the chat page with reasoning and a tool call');
  await page.screenshot({ path: `${outdir}/web-chat-rendering.png` });
  hostile = false;

  // ---- dashboard
  await page.goto(`${url}/dashboard`, { waitUntil: 'load' });
  const points = () => page.$eval('#chart-tokens', (f) => Number(f.dataset.points));
  await page.waitForFunction(() => Number(document.getElementById('chart-tokens').dataset.points) >= 3, { timeout: 20000 });
  const p0 = await points();
  const max0 = await page.$eval('#chart-tokens', (f) => JSON.parse(f.dataset.max)[0]);
  if (max0 !== 0) fail(`the reused-tokens series is ${max0} before any request on the dashboard`);
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'In the beginning God created' }], max_tokens: 8 }),
  });
  if (!r.ok) fail(`chat request: HTTP ${r.status}`);
  await page.waitForFunction(() => {
    const f = document.getElementById('chart-tokens');
    return Number(f.dataset.points) > 0 && JSON.parse(f.dataset.max || '[0]')[0] > 0;
  }, { timeout: 20000, polling: 100 });
  const p1b = await points();
  if (!(p1b > p0)) fail(`dashboard points did not increase (${p0} -> ${p1b})`);
  ok(`the dashboard charts update: ${p0} -> ${p1b} points, the reused-tokens series rose after a request`);
  await page.waitForFunction(() => Number(document.getElementById('prefixes').dataset.rows || 0) >= 1, { timeout: 20000, polling: 200 });
  const firstRow = await page.$eval('#prefixes tbody tr', (tr) => [...tr.children].map((td) => td.textContent));
  if (!(Number(firstRow[0]) > 0) || !firstRow[4]) fail(`the prefixes table's first row: ${JSON.stringify(firstRow)}`);
  ok(`the dashboard lists the largest cached prefixes: ${firstRow[0]} tokens first`);
  const charts = await page.$$eval('.chart canvas', (l) => l.length);
  if (charts < 7) fail(`dashboard draws ${charts} charts`);
  await new Promise((res) => setTimeout(res, 1500));
  await page.screenshot({ path: `${outdir}/web-dashboard.png`, fullPage: true });
  await axe('the dashboard');
  if (problems.length) fail(`browser console errors:\n  ${problems.join('\n  ')}`);
  ok('no console error or CSP refusal on either page');
} finally {
  await browser.close();
}
console.log('PASS browser');
