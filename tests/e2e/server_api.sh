#!/usr/bin/env bash
# server_api.sh — end-to-end test of `kvtier serve` over HTTP with curl: every endpoint, every error
# class, SSE format, multi-turn prompt-cache reuse, 8 concurrent clients, auth, the non-loopback
# guard, SSD-tier restart (flush -> SIGTERM -> new process -> reuse) and clean SIGTERM exits.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"

# ------------------------------------------------------------------ basic endpoints
srv_start --max-body-mb 1 --model-alias tiny-test
expect 200 GET /health
[ "$(jget "j['status']")" = ok ] || fail "/health body"
expect 200 GET /v1/models
[ "$(jget "j['data'][0]['id']")" = tiny-test ] || fail "/v1/models id"
expect 200 GET /v1/models/tiny-test
expect 404 GET /v1/models/gpt-4
expect 200 GET /stats
jget "j['prompt_cache']['entries'], j['prompt_cache']['reuse_impossible']['budget'], j['kv']['scheme'], j['kv']['pool_budget_bytes'], j['requests']['total']" >/dev/null || fail "/stats fields"
[ "$(jget "j['ssd_cache'] is None")" = True ] || fail "/stats ssd_cache should be null without --ssd-cache"
expect 200 GET /metrics
grep -q '^# TYPE kvtier_prompt_cache_hits_total counter$' "$TMP/resp" || fail "/metrics TYPE line"
grep -q '^# HELP kvtier_kv_pool_used_bytes ' "$TMP/resp" || fail "/metrics HELP line"
grep -q '^kvtier_kv_pool_budget_bytes [0-9]' "$TMP/resp" || fail "/metrics sample"
expect 200 POST /admin/cache/flush
[ "$(jget "j['durable'], j['entries']")" = "True 0" ] || fail "flush without SSD tier: $(cat $TMP/resp)"
ok "health, models, stats, metrics, flush"

# ------------------------------------------------------------------ completions
B='{"model":"tiny-test","messages":[{"role":"user","content":"Hello there, tell me a story about a cat."}],"temperature":0,"max_tokens":12}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
C1=$(jget "j['choices'][0]['message']['content']")
P1=$(jget "j['usage']['prompt_tokens']")
[ "$(jget "j['object']")" = chat.completion ] || fail "chat object"
jget "j['choices'][0]['finish_reason'] in ('stop','length') or sys.exit(1)" >/dev/null || fail "finish_reason"
[ "$(jget "j['usage']['total_tokens'] == j['usage']['prompt_tokens'] + j['usage']['completion_tokens']")" = True ] || fail "usage totals"
jget "j['usage']['prompt_tokens_details']['cached_tokens']" >/dev/null || fail "cached_tokens missing"
[ "$(jget "j['usage']['completion_tokens'] <= 12")" = True ] || fail "max_tokens not honoured"
cp "$TMP/resp" "$TMP/turn1.json"
# content parts, model = file basename, no model at all
expect 200 POST /v1/chat/completions "$(jbody '{"model":"m.gguf","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":2,"temperature":0}')"
expect 200 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":2,"top_k":5,"top_p":0.9,"min_p":0.05,"seed":3,"repeat_penalty":1.1,"presence_penalty":0.2,"frequency_penalty":0.2,"stop":["\n","zz"]}')"
expect 200 POST /v1/completions "$(jbody '{"prompt":"Once upon a time","max_tokens":5,"temperature":0}')"
[ "$(jget "j['object']")" = text_completion ] || fail "completion object"
jget "j['choices'][0]['text']" >/dev/null || fail "completion text"
expect 200 POST /v1/completions "$(jbody '{"prompt":[1,2,3,4,5],"max_tokens":3,"temperature":0,"stop":"x"}')"
[ "$(jget "j['usage']['prompt_tokens']")" = 5 ] || fail "token-id prompt length"
ok "chat + completions (string and token-id prompts)"

# stop string: cut the greedy turn-1 reply at a piece of its own text
python3 - "$TMP/turn1.json" >"$TMP/stop.json" <<'EOF' || fail "turn-1 reply too short for the stop test"
import json, sys
t1 = json.load(open(sys.argv[1]))
c = t1["choices"][0]["message"]["content"]
assert len(c) >= 8
stop = c[len(c) // 2: len(c) // 2 + 3]
print(json.dumps({"messages": [{"role": "user", "content": "Hello there, tell me a story about a cat."}],
                  "temperature": 0, "max_tokens": 12, "stop": [stop], "_expect": c[:c.index(stop)]}))
EOF
expect 200 POST /v1/chat/completions "$TMP/stop.json"
python3 - "$TMP/stop.json" "$TMP/resp" <<'EOF' || fail "stop string not honoured"
import json, sys
want = json.load(open(sys.argv[1]))["_expect"]
got = json.load(open(sys.argv[2]))["choices"][0]
assert got["message"]["content"] == want and got["finish_reason"] == "stop", (got, want)
EOF
ok "stop strings cut the output (finish_reason stop)"

# ------------------------------------------------------------------ errors
chk_err() { # CODE METHOD PATH BODYFILE [curl args]
  local code=$1; shift
  expect "$code" "$@"
  jget "j['error']['message'], j['error']['type']" >/dev/null || fail "$2: no OpenAI error object"
}
chk_err 400 POST /v1/chat/completions "$(jbody '{"messages": [')"
chk_err 400 POST /v1/chat/completions "$(jbody '{"messages":"hi"}')"
chk_err 400 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}')"
chk_err 400 POST /v1/chat/completions "$(jbody '{"temperature":0}')"
chk_err 400 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"x"}],"max_tokens":-3}')"
chk_err 400 POST /v1/completions "$(jbody '{"prompt":[1,2,99999999]}')"
chk_err 400 POST /v1/completions "$(jbody '{"prompt":[1,2.5]}')"
printf '{"messages":[{"role":"user","content":"bad \xff\xfe utf8"}]}' >"$TMP/bad.json"
chk_err 400 POST /v1/chat/completions "$TMP/bad.json"
printf '{"messages":[{"role":"user","content":"lone \\ud800 surrogate"}]}' >"$TMP/bad2.json"
chk_err 400 POST /v1/chat/completions "$TMP/bad2.json"
chk_err 404 POST /v1/chat/completions "$(jbody '{"model":"gpt-4","messages":[{"role":"user","content":"x"}]}')"
[ "$(jget "j['error']['code']")" = model_not_found ] || fail "unknown model code"
chk_err 400 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"x"}],"max_tokens":100000}')"
[ "$(jget "j['error']['code']")" = context_length_exceeded ] || fail "context_length_exceeded code"
python3 -c "import json; print(json.dumps({'prompt': 'word ' * 3000, 'max_tokens': 1}))" >"$TMP/long.json"
chk_err 400 POST /v1/completions "$TMP/long.json"
[ "$(jget "j['error']['code']")" = context_length_exceeded ] || fail "long prompt code"
python3 -c "import json; print(json.dumps({'prompt': 'x' * (2 << 20)}))" >"$TMP/huge.json"
chk_err 413 POST /v1/completions "$TMP/huge.json"
# the same oversize body without Content-Length (chunked upload)
chk_err 413 POST /v1/completions "$TMP/huge.json" -H 'Transfer-Encoding: chunked'
chk_err 404 GET /v1/nope
chk_err 405 GET /v1/chat/completions
chk_err 405 POST /v1/models "$(jbody '{}')"
chk_err 405 GET /admin/cache/flush
expect 200 GET /health
ok "errors: malformed, types, missing, ids, UTF-8, model, context, 413, 404, 405"

# ------------------------------------------------------------------ streaming
SB='{"messages":[{"role":"user","content":"Hello there, tell me a story about a cat."}],"temperature":0,"max_tokens":12,"stream":true,"stream_options":{"include_usage":true}}'
curl -sN --max-time 120 -H 'Content-Type: application/json' --data-binary "$SB" "$SRV_URL/v1/chat/completions" >"$TMP/sse.txt" || fail "stream request"
python3 - "$TMP/sse.txt" "$TMP/turn1.json" <<'EOF' || fail "SSE format"
import json, sys
raw = open(sys.argv[1]).read()
events = [e for e in raw.split("\n\n") if e.strip()]
assert all(e.startswith("data: ") for e in events), events[:3]
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
usage = chunks[-1]
assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1, usage
fin = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
assert len(fin) == 1 and fin[0]["choices"][0]["finish_reason"] in ("stop", "length")
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
ref = json.load(open(sys.argv[2]))
assert text == ref["choices"][0]["message"]["content"], (text, ref["choices"][0]["message"]["content"])
assert usage["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
EOF
curl -sN --max-time 120 --data-binary '{"prompt":"abc","max_tokens":4,"temperature":0,"stream":true}' "$SRV_URL/v1/completions" >"$TMP/sse2.txt" || fail "stream completion"
python3 - "$TMP/sse2.txt" <<'EOF' || fail "completion SSE format"
import json, sys
ev = [e for e in open(sys.argv[1]).read().split("\n\n") if e.strip()]
assert ev[-1] == "data: [DONE]"
ch = [json.loads(e[6:]) for e in ev[:-1]]
assert all(c["object"] == "text_completion" for c in ch) and "usage" not in ch[-1]
assert ch[-1]["choices"][0]["finish_reason"] in ("stop", "length")
EOF
ok "SSE streaming (chat with include_usage; completions)"

# ------------------------------------------------------------------ multi-turn reuse
python3 - "$TMP/turn1.json" >"$TMP/turn2.json" <<'EOF'
import json, sys
t1 = json.load(open(sys.argv[1]))
print(json.dumps({"messages": [
    {"role": "user", "content": "Hello there, tell me a story about a cat."},
    {"role": "assistant", "content": t1["choices"][0]["message"]["content"]},
    {"role": "user", "content": "And then what happened?"}], "temperature": 0, "max_tokens": 8}))
EOF
expect 200 POST /v1/chat/completions "$TMP/turn2.json"
CT=$(jget "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$CT" -ge $((P1 - 1)) ] || fail "turn 2 cached_tokens $CT < turn-1 prompt $P1 - 1"
ok "multi-turn: turn 2 reused $CT tokens (turn-1 prompt $P1)"

# ------------------------------------------------------------------ 8 concurrent clients
CB='{"messages":[{"role":"user","content":"Concurrent clients all ask the same thing."}],"temperature":0,"max_tokens":10}'
pids=()
for i in 1 2 3 4 5 6 7 8; do
  curl -s --max-time 180 -o "$TMP/c$i.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary "$CB" "$SRV_URL/v1/chat/completions" >"$TMP/c$i.code" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "concurrent curl failed"; done
python3 - "$TMP" <<'EOF' || fail "concurrent answers differ"
import json, sys
d = sys.argv[1]
codes = [open(f"{d}/c{i}.code").read() for i in range(1, 9)]
assert codes == ["200"] * 8, codes
texts = [json.load(open(f"{d}/c{i}.json"))["choices"][0]["message"]["content"] for i in range(1, 9)]
assert len(set(texts)) == 1, texts
EOF
ok "8 concurrent clients, identical greedy output"

# ------------------------------------------------------------------ client disconnect mid-stream
# (a prompt of several KV blocks, so that what the cancelled request computed can be reused)
DPROMPT="disconnect me: $(printf 'block %s of the cancelled prompt, ' $(seq 1 40))"
curl -sN --max-time 1 --data-binary "{\"prompt\":\"$DPROMPT\",\"max_tokens\":1500,\"temperature\":1,\"stream\":true}" \
  "$SRV_URL/v1/completions" >/dev/null 2>&1; crc=$?
expect 200 POST /v1/completions "$(jbody '{"prompt":"still alive?","max_tokens":2,"temperature":0}')"
if [ "$crc" -eq 28 ]; then # the client really left mid-generation: the generation must have been cancelled
  for i in $(seq 1 50); do # bounded wait for the worker to notice
    expect 200 GET /stats
    [ "$(jget "j['requests']['cancelled'] >= 1")" = True ] && break
    sleep 0.2
  done
  [ "$(jget "j['requests']['cancelled'] >= 1")" = True ] || fail "disconnect did not cancel the generation"
fi
# the cancelled request's KV stays in the cache: the same prompt again reuses it
expect 200 POST /v1/completions "$(jbody "{\"prompt\":\"$DPROMPT\",\"max_tokens\":1,\"temperature\":0}")"
DPT=$(jget "j['usage']['prompt_tokens']"); DCT=$(jget "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$DCT" -gt 0 ] || fail "cancelled request's KV not reused: cached_tokens $DCT of $DPT"
ok "after a disconnect the same prompt reuses $DCT of $DPT prompt tokens"
curl -s --max-time 1 --data-binary '{"prompt":"disconnect me too","max_tokens":2000,"temperature":1}' \
  "$SRV_URL/v1/completions" >/dev/null 2>&1; crc2=$?
expect 200 GET /health
if [ "$crc" -eq 28 ] && [ "$crc2" -eq 28 ]; then
  for i in $(seq 1 50); do # the worker notices within a token or two; bounded wait
    expect 200 GET /stats
    [ "$(jget "j['requests']['cancelled'] >= 2")" = True ] && break
    sleep 0.2
  done
  [ "$(jget "j['requests']['cancelled'] >= 2")" = True ] || fail "non-streaming disconnect did not cancel"
fi
ok "server survives clients disconnecting mid-generation (stream and non-stream)"

srv_stop TERM
ok "SIGTERM: exit 0"

# ------------------------------------------------------------------ auth
srv_start --api-key s3cret
chk_err 401 GET /health
chk_err 401 GET /stats
chk_err 401 POST /admin/cache/flush "$(jbody '{}')"
AUTH=(-H 'Authorization: Bearer wrong')
chk_err 401 GET /v1/models
AUTH=(-H 'Authorization: Bearer s3cret')
expect 200 GET /health
expect 200 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}')"
expect 200 POST /admin/cache/flush "$(jbody '{}')"
AUTH=()
srv_stop INT
ok "auth: 401 without/with wrong key, 200 with the key; SIGINT exit 0"

# non-loopback without a key is refused before the model loads
"$KV" serve -m "$MODEL" --host 0.0.0.0 --port 1 >"$TMP/nl.log" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "non-loopback bind without key: exit $rc, expected 2"
grep -q -- "--insecure" "$TMP/nl.log" || fail "non-loopback message should mention --insecure"
"$KV" serve -m "$MODEL" --prompt-cache 0 --ssd-cache "$TMP/x" >"$TMP/pc0.log" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "--ssd-cache with --prompt-cache 0: exit $rc, expected 2"
ok "non-loopback guard and flag conflicts exit 2"

# ------------------------------------------------------------------ shutdown with work in flight
srv_start
curl -s --max-time 120 -o "$TMP/if.json" -w '%{http_code}' --data-binary '{"prompt":"drain me","max_tokens":40,"temperature":0}' \
  "$SRV_URL/v1/completions" >"$TMP/if.code" &
IFP=$!
sleep 0.5
srv_stop TERM
wait "$IFP"
[ "$(cat "$TMP/if.code")" = 200 ] || fail "in-flight request during SIGTERM: HTTP $(cat "$TMP/if.code")"
ok "SIGTERM drains the in-flight request (200) and exits 0"

srv_start --shutdown-timeout 2
curl -s --max-time 120 -o "$TMP/to.json" -w '%{http_code}' --data-binary '{"prompt":"too long","max_tokens":1800,"temperature":1}' \
  "$SRV_URL/v1/completions" >"$TMP/to.code" &
TOP=$!
sleep 0.5
T0=$(date +%s)
srv_stop TERM
wait "$TOP"
T1=$(date +%s)
[ $((T1 - T0)) -le 10 ] || fail "shutdown with --shutdown-timeout 2 took $((T1 - T0)) s"
case "$(cat "$TMP/to.code")" in 200|503) ;; *) fail "request cancelled by shutdown: HTTP $(cat "$TMP/to.code")";; esac
ok "--shutdown-timeout cancels a long request (HTTP $(cat "$TMP/to.code")) and exits 0 in $((T1 - T0)) s"

# ------------------------------------------------------------------ out of KV memory -> 503
srv_start --kv-pool-gb 0.0001 --block-tokens 64
python3 -c "import json; print(json.dumps({'prompt': 'word ' * 1200, 'max_tokens': 4}))" >"$TMP/oom.json"
expect 503 POST /v1/completions "$TMP/oom.json"
[ "$(jget "j['error']['code']")" = out_of_memory ] || fail "out-of-KV-memory code"
expect 200 POST /v1/completions "$(jbody '{"prompt":"hi","max_tokens":2}')"
srv_stop TERM
ok "out of KV memory: 503 out_of_memory, server keeps serving"

# ------------------------------------------------------------------ SSD restart
mkdir -p "$TMP/ssd"
python3 -c "import json; print(json.dumps({'prompt': 'The quick brown fox jumps over the lazy dog. ' * 12, 'max_tokens': 8, 'temperature': 0}))" >"$TMP/rs.json"
srv_start --ssd-cache "$TMP/ssd"
expect 200 POST /v1/completions "$TMP/rs.json"
R1=$(jget "j['choices'][0]['text']"); RP=$(jget "j['usage']['prompt_tokens']")
expect 200 POST /admin/cache/flush "$(jbody '{}')"
[ "$(jget "j['durable']")" = True ] || fail "flush not durable: $(cat "$TMP/resp")"
expect 200 GET /stats
[ "$(jget "j['ssd_cache'] is not None")" = True ] || fail "/stats ssd_cache should be an object"
srv_stop TERM
srv_start --ssd-cache "$TMP/ssd"
expect 200 POST /v1/completions "$TMP/rs.json"
R2=$(jget "j['choices'][0]['text']"); RC=$(jget "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$RC" -ge $((RP - 1)) ] || fail "after restart cached_tokens $RC < prompt $RP - 1"
[ "$R1" = "$R2" ] || fail "after restart the output differs: '$R1' vs '$R2'"
srv_stop TERM
ok "SSD restart: $RC of $RP prompt tokens restored, identical output"

echo "PASS server_api"
