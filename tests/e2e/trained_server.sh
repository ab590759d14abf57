#!/usr/bin/env bash
# trained_server.sh — the `make run` demo model (data/models/kjv-target-q8_0.gguf) through the server
# as `kvtier demo` runs it (RAM tier + SSD tier): chat (greedy, repeat penalty 1.3, KJV-like answer, <|im_end|> ends the
# turn), SSE streaming equal to the non-streamed answer, multi-turn prompt reuse from the RAM tier,
# and an SSD-tier restart (flush -> SIGTERM -> new process -> same answer from restored blocks).
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"
MODEL=$(cd "$(dirname "$0")/../.." && pwd)/data/models/kjv-target-q8_0.gguf
[ -f "$MODEL" ] || fail "$MODEL missing"
mkdir -p "$TMP/ssd"

# ------------------------------------------------------------------ chat
srv_start --prompt-cache 2 --ssd-cache "$TMP/ssd" -t 2
B1='{"messages":[{"role":"user","content":"In the beginning God created the heaven and the earth."}],"temperature":0,"repeat_penalty":1.3,"max_tokens":48}'
expect 200 POST /v1/chat/completions "$(jbody "$B1")"
cp "$TMP/resp" "$TMP/turn1.json"
python3 - "$TMP/turn1.json" "$(dirname "$MODEL")/heldout.txt" <<'PY' || fail "chat answer"
import json, re, sys
j = json.load(open(sys.argv[1])); c = j["choices"][0]
text = c["message"]["content"]
words = [w.lower() for w in re.findall(r"[A-Za-z]+", text)]
vocab = set(re.findall(r"[a-z]+", open(sys.argv[2]).read().lower()))
print(f"  answer ({c['finish_reason']}): {text!r}")
assert c["finish_reason"] in ("stop", "length")
assert "<|im" not in text, "control tokens leaked into the answer"
# KJV-like: enough distinct words, nearly all of them words of the (held-out) KJV text
assert len(words) >= 8 and len(set(words)) >= 5, "answer too short or repetitive"
assert sum(w in vocab for w in words) >= 0.8 * len(words), "answer does not read like KJV"
PY
ok "chat: greedy KJV-like answer"

# ------------------------------------------------------------------ streaming
SB=$(python3 -c "import json,sys; b=json.loads(sys.argv[1]); b['stream']=True; b['stream_options']={'include_usage':True}; print(json.dumps(b))" "$B1")
curl -sN --max-time 120 -H 'Content-Type: application/json' --data-binary "$SB" "$SRV_URL/v1/chat/completions" >"$TMP/sse.txt" || fail "stream request"
python3 - "$TMP/sse.txt" "$TMP/turn1.json" <<'PY' || fail "SSE stream differs from the non-streamed answer"
import json, sys
events = [e for e in open(sys.argv[1]).read().split("\n\n") if e.strip()]
assert events[-1] == "data: [DONE]"
chunks = [json.loads(e[6:]) for e in events[:-1]]
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
ref = json.load(open(sys.argv[2]))
assert text == ref["choices"][0]["message"]["content"], (text, ref)
assert chunks[-1]["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
PY
ok "streaming: SSE deltas equal the non-streamed answer"

# ------------------------------------------------------------------ multi-turn reuse
B2=$(python3 - "$TMP/turn1.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]
print(json.dumps({"messages": [{"role": "user", "content": "In the beginning God created the heaven and the earth."},
                               {"role": "assistant", "content": a},
                               {"role": "user", "content": "And the LORD spake unto Moses, saying,"}],
                  "temperature": 0, "repeat_penalty": 1.3, "max_tokens": 32}))
PY
)
expect 200 POST /v1/chat/completions "$(jbody "$B2")"
P1=$(python3 -c "import json;print(json.load(open('$TMP/turn1.json'))['usage']['prompt_tokens'])")
C2=$(jget "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$C2" -ge "$P1" ] || fail "turn 2 reused $C2 tokens, fewer than turn 1's prompt ($P1)"
cp "$TMP/resp" "$TMP/turn2.json"
ok "reuse: turn 2 took $C2 cached tokens from the RAM tier"

# ------------------------------------------------------------------ restart from the SSD tier
expect 200 POST /admin/cache/flush "$(jbody '{}')"
[ "$(jget "j['durable']")" = True ] || fail "flush not durable"
srv_stop TERM
srv_start --prompt-cache 2 --ssd-cache "$TMP/ssd" -t 2
expect 200 POST /v1/chat/completions "$(jbody "$B2")"
R=$(jget "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$R" -ge "$P1" ] || fail "after restart only $R cached tokens"
python3 -c "
import json,sys
a=json.load(open('$TMP/turn2.json'))['choices'][0]['message']['content']; b=json.load(open('$TMP/resp'))['choices'][0]['message']['content']
sys.exit(0 if a==b else 1)" || fail "after restart the answer differs"
srv_stop TERM
ok "restart: $R tokens restored from the SSD tier, identical answer"
