#!/usr/bin/env bash
# server_spec.sh — speculative decoding in `kvtier serve --parallel 3` (docs/speculative.md): three
# concurrent greedy completions on the trained pair (data/models), each row with its own draft row,
# give the same texts as a server without a draft; /stats `speculative` counts the rounds (null
# without a draft) and /metrics has the kvtier_spec_* series.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"
MODEL=data/models/kjv-target-q8_0.gguf
DRAFT=data/models/kjv-draft-q8_0.gguf
cd "$(dirname "$0")/../.."

cat >"$TMP/clients.py" <<'PY'
import json, sys, threading, http.client
port, out = int(sys.argv[1]), sys.argv[2]
PROMPTS = ["And God said, Let there be light", "And Moses said unto the people,",
           "And it came to pass, when the king heard the words of the law"]
def run(i, res):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[i], "max_tokens": 48, "temperature": 0}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    res[i] = {"status": r.status, "text": json.loads(r.read())["choices"][0]["text"] if r.status == 200 else None}
res = {}
ts = [threading.Thread(target=run, args=(i, res)) for i in range(len(PROMPTS))]
for t in ts: t.start()
for t in ts: t.join()
json.dump([res[i] for i in range(len(PROMPTS))], open(out, "w"))
PY

srv_start --draft-model $DRAFT --draft-max 4 --draft-p-min 0 --parallel 3 --threads 2 --prompt-cache 0
python3 "$TMP/clients.py" "$SRV_PORT" "$TMP/spec.json" || fail "clients (draft)"
expect 200 GET /stats
[ "$(jget "j['speculative']['rounds'] > 0 and j['speculative']['accepted_tokens'] <= j['speculative']['proposed_tokens']")" = True ] ||
  fail "/stats speculative: $(jget "j['speculative']")"
echo "  /stats speculative: $(jget "j['speculative']")"
expect 200 GET /metrics
grep -q '^kvtier_spec_rounds_total [1-9]' "$TMP/resp" || fail "/metrics lacks kvtier_spec_rounds_total"
srv_stop

srv_start --parallel 3 --threads 2 --prompt-cache 0
python3 "$TMP/clients.py" "$SRV_PORT" "$TMP/plain.json" || fail "clients (plain)"
expect 200 GET /stats
[ "$(jget "j['speculative'] is None")" = True ] || fail "/stats speculative is not null without a draft"
srv_stop

python3 - "$TMP/plain.json" "$TMP/spec.json" <<'PY' || fail "texts differ with the draft"
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for x, y in zip(a, b):
    assert x["status"] == 200 and y["status"] == 200, (x, y)
    assert x["text"] == y["text"], (x["text"], y["text"])
assert all(len(x["text"]) > 20 for x in a), a  # real answers, not end-of-generation at once
print(f"  {len(a)} concurrent greedy answers identical, e.g. {b[0]['text'][:60]!r}")
PY
ok "serve --parallel 3 with a draft: greedy answers identical, /stats and /metrics count the rounds"
