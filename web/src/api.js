// api.js — the pages' one way to call the server: the API key (--api-key) is asked for once, kept in
// localStorage and sent as Authorization: Bearer; a 401 asks again and retries once.
const KEY = 'kvtier.apiKey';

export function apiKey() {
  return localStorage.getItem(KEY) || '';
}

// The key dialog, made on first use (both pages share it).
function keyDialog() {
  let dlg = document.getElementById('keydlg');
  if (dlg) return dlg;
  dlg = document.createElement('dialog');
  dlg.id = 'keydlg';
  dlg.setAttribute('aria-labelledby', 'keymsg');
  const msg = document.createElement('p');
  msg.id = 'keymsg';
  const label = document.createElement('label');
  label.htmlFor = 'keyinput';
  label.textContent = 'API key ';
  const input = document.createElement('input');
  Object.assign(input, { id: 'keyinput', type: 'password', autocomplete: 'off' });
  const ok = document.createElement('button');
  Object.assign(ok, { id: 'keyok', type: 'button', textContent: 'OK' });
  dlg.append(msg, label, input, ok);
  document.body.append(dlg);
  return dlg;
}

// Shows the key dialog and resolves once a key was entered.
function askKey(message) {
  const dlg = keyDialog();
  const input = document.getElementById('keyinput');
  document.getElementById('keymsg').textContent = message;
  input.value = '';
  return new Promise((resolve) => {
    const ok = document.getElementById('keyok');
    const done = () => {
      ok.removeEventListener('click', done);
      localStorage.setItem(KEY, input.value.trim());
      dlg.close();
      resolve();
    };
    ok.addEventListener('click', done);
    input.onkeydown = (e) => { if (e.key === 'Enter') { e.preventDefault(); done(); } };
    dlg.showModal();
    input.focus();
  });
}

export async function apiFetch(path, init = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = { ...(init.headers || {}) };
    const k = apiKey();
    if (k) headers.Authorization = `Bearer ${k}`;
    const r = await fetch(path, { ...init, headers });
    if (r.status !== 401 || attempt > 0) return r;
    await askKey(k ? 'That API key was refused; enter the server\'s --api-key:' :
      'This server needs an API key (--api-key):');
  }
}
