#!/usr/bin/env bash
# agent_api.sh — end-to-end test of the agent-facing API fields of `kvtier serve` (docs/server.md):
# logprobs (chat and completions, streaming, equal to `kvtier run --json --logprobs`), n > 1 sharing
# the prompt's KV, logit_bias, stop as string and list, max_completion_tokens, seed reproducibility,
# stream_options.include_usage, unknown fields ignored, response_format json_schema (a nested
# schema gives schema-valid JSON 100 times out of 100 on a random model) and json_object, and the
# JSON 400s naming the field for bad tools, tool_choice, schemas and logprobs.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"

MODEL=$TMP/m.gguf
"$KV" gen-model --arch qwen3 --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
srv_start

# ------------------------------------------------------------------ logprobs == kvtier run --json
B='{"prompt":[15496,11,995,0,314],"max_tokens":6,"temperature":0,"logprobs":3}'
expect 200 POST /v1/completions "$(jbody "$B")"
cp "$TMP/resp" "$TMP/compl.json"
# the server holds the model open; run reads the same file
"$KV" run -m "$MODEL" --tokens 15496,11,995,0,314 -n 6 --temp 0 --no-cache --json --logprobs 3 2>/dev/null >"$TMP/run.json" ||
  fail "kvtier run --json --logprobs"
python3 - "$TMP/compl.json" "$TMP/run.json" <<'PY' || fail "completions logprobs differ from kvtier run --json"
import json, sys
c = json.load(open(sys.argv[1])); r = json.loads(open(sys.argv[2]).readline())
lp = c["choices"][0]["logprobs"]
n = c["usage"]["completion_tokens"]
assert n == len(r["tokens"]) and len(lp["token_logprobs"]) == n, (n, r["tokens"], lp)
for i in range(n):
    a, b = lp["token_logprobs"][i], r["logprobs"][i]["logprob"]
    assert abs(a - b) < 1e-4, (i, a, b)
    assert len(lp["top_logprobs"][i]) >= 1 and abs(max(lp["top_logprobs"][i].values()) - r["logprobs"][i]["top"][0][1]) < 1e-4
    assert lp["token_logprobs"][i] <= max(lp["top_logprobs"][i].values()) + 1e-6
assert lp["text_offset"][0] == 0 and all(lp["text_offset"][k] <= lp["text_offset"][k + 1] for k in range(n - 1))
PY
ok "completions logprobs equal kvtier run --json --logprobs"

B='{"messages":[{"role":"user","content":"Say something"}],"max_tokens":5,"temperature":0,"logprobs":true,"top_logprobs":2}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
python3 - "$TMP/resp" <<'PY' || fail "chat logprobs shape"
import json, sys
j = json.load(open(sys.argv[1])); ch = j["choices"][0]
ents = ch["logprobs"]["content"]
assert len(ents) == j["usage"]["completion_tokens"], (len(ents), j["usage"])
for e in ents:
    assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 2
    assert e["logprob"] <= 0 and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
    assert e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6  # greedy: the drawn token is the best
PY
sed 's/"max_tokens":5/"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}/' "$TMP/req.json" >"$TMP/req2.json"
expect 200 POST /v1/chat/completions "$TMP/req2.json"
python3 - "$TMP/resp" <<'PY' || fail "streamed chat logprobs / include_usage"
import json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: {")]
n = sum(len((c.get("logprobs") or {}).get("content") or []) for e in ev for c in e["choices"])
usage = [e for e in ev if e.get("usage")]
assert len(usage) == 1 and usage[0]["choices"] == [] and ev[-1] is usage[0], ev[-1]
assert n == usage[0]["usage"]["completion_tokens"], (n, usage)
assert [c["finish_reason"] for e in ev for c in e["choices"] if c["finish_reason"]] in (["length"], ["stop"])
PY
ok "chat logprobs (top_logprobs 2), streaming logprobs and include_usage"

# ------------------------------------------------------------------ n, seed, logit_bias, stop, max_completion_tokens
B='{"messages":[{"role":"user","content":"Three samples please"}],"max_tokens":8,"temperature":1,"n":3,"seed":11}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
cp "$TMP/resp" "$TMP/n1.json"
python3 - "$TMP/resp" <<'PY' || fail "n = 3"
import json, sys
j = json.load(open(sys.argv[1]))
assert [c["index"] for c in j["choices"]] == [0, 1, 2], j["choices"]
texts = [c["message"]["content"] for c in j["choices"]]
assert len(set(texts)) > 1, texts  # seeds seed, seed+1, seed+2 differ
assert j["usage"]["completion_tokens"] <= 24
PY
expect 200 POST /v1/chat/completions "$TMP/req.json"
python3 -c "import json,sys; a=json.load(open('$TMP/n1.json')); b=json.load(open('$TMP/resp')); assert [c['message'] for c in a['choices']]==[c['message'] for c in b['choices']]" ||
  fail "same seed, same choices"
[ "$(jget "j['usage']['prompt_tokens_details']['cached_tokens'] > 0")" = True ] || fail "repeat request reuses the prompt KV"
ok "n = 3 (distinct samples, same seed reproduces them)"

expect 200 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"x"}],"n":2,"max_tokens":4,"stream":true,"seed":3}')"
python3 - "$TMP/resp" <<'PY' || fail "streamed n = 2"
import json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: {")]
idx = sorted({c["index"] for e in ev for c in e["choices"]})
fin = [c["index"] for e in ev for c in e["choices"] if c["finish_reason"]]
assert idx == [0, 1] and sorted(fin) == [0, 1], (idx, fin)
PY
ok "streamed n = 2"

expect 200 POST /v1/completions "$(jbody '{"prompt":"Hello","max_tokens":6,"temperature":1,"seed":5,"logit_bias":{"2068":100},"logprobs":0}')"
python3 - "$TMP/resp" <<'PY' || fail "logit_bias +100 forces the token"
import json, sys
j = json.load(open(sys.argv[1])); ch = j["choices"][0]
toks = ch["logprobs"]["tokens"]
assert len(toks) == 6 and len(set(toks)) == 1, toks
assert all(x > -0.01 for x in ch["logprobs"]["token_logprobs"]), ch["logprobs"]["token_logprobs"]
PY
ok "logit_bias"

B='{"messages":[{"role":"user","content":"count"}],"max_completion_tokens":3,"temperature":0}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
[ "$(jget "j['usage']['completion_tokens'] <= 3 and j['choices'][0]['finish_reason']")" = length ] || fail "max_completion_tokens"
FULL=$(python3 -c "import json; print(json.dumps(json.load(open('$TMP/resp'))['choices'][0]['message']['content']))")
# the generated text's second character as a stop string (string and list forms)
STOP=$(python3 -c "import json,sys; t=json.loads(sys.argv[1]); print(json.dumps(t[1:3]))" "$FULL")
for form in "$STOP" "[\"zzzz\",$STOP]"; do
  expect 200 POST /v1/chat/completions "$(jbody "{\"messages\":[{\"role\":\"user\",\"content\":\"count\"}],\"max_tokens\":3,\"temperature\":0,\"stop\":$form}")"
  python3 - "$TMP/resp" "$FULL" "$STOP" <<'PY' || fail "stop $form"
import json, sys
j = json.load(open(sys.argv[1])); full = json.loads(sys.argv[2]); stop = json.loads(sys.argv[3])
c = j["choices"][0]
assert c["finish_reason"] == "stop" and c["message"]["content"] == full[:full.index(stop)], (c, full, stop)
PY
done
ok "max_completion_tokens, stop as string and list"

B='{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"user":"u-1","metadata":{"a":1},"store":false,"service_tier":"auto","frobnicate":[1,2],"parallel_tool_calls":true,"presence_penalty":0.5,"frequency_penalty":0.5,"chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":"low"}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
ok "unknown fields ignored; user, penalties, chat_template_kwargs, reasoning_effort accepted"

# ------------------------------------------------------------------ structured output
SCHEMA='{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string","maxLength":10},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},"loc":{"type":"object","properties":{"lat":{"type":"number"},"ok":{"type":"boolean"},"note":{"type":["string","null"],"maxLength":6}},"required":["lat","ok","note"],"additionalProperties":false}},"required":["id","name","tags","loc"],"additionalProperties":false}'
printf '%s' "$SCHEMA" >"$TMP/schema.json"
for i in $(seq 1 20); do
  expect 200 POST /v1/chat/completions "$(jbody "{\"messages\":[{\"role\":\"user\",\"content\":\"item $i\"}],\"max_tokens\":300,\"temperature\":1,\"n\":5,\"seed\":$i,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"item\",\"strict\":true,\"schema\":$SCHEMA}}}")"
  cp "$TMP/resp" "$TMP/so.$i.json"
done
python3 - "$TMP" <<'PY' || fail "response_format json_schema: not 100/100 valid"
import json, sys, glob
def valid(v):
    assert isinstance(v, dict) and set(v) == {"id", "name", "tags", "loc"}
    assert isinstance(v["id"], int) and not isinstance(v["id"], bool)
    assert isinstance(v["name"], str) and len(v["name"]) <= 10
    assert isinstance(v["tags"], list) and len(v["tags"]) <= 3 and all(t in ("a", "b", "c") for t in v["tags"])
    l = v["loc"]
    assert set(l) == {"lat", "ok", "note"} and isinstance(l["lat"], (int, float)) and isinstance(l["ok"], bool)
    assert l["note"] is None or (isinstance(l["note"], str) and len(l["note"]) <= 6)
ok = 0
for f in sorted(glob.glob(sys.argv[1] + "/so.*.json")):
    for c in json.load(open(f))["choices"]:
        try:
            valid(json.loads(c["message"]["content"])); assert c["finish_reason"] == "stop"; ok += 1
        except Exception as ex:
            print("invalid:", repr(ex), c); raise
assert ok == 100, ok
PY
ok "response_format json_schema (nested): 100/100 schema-valid"
expect 200 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"obj"}],"max_tokens":200,"temperature":1,"seed":1,"n":4,"response_format":{"type":"json_object"}}')"
python3 -c "
import json; j=json.load(open('$TMP/resp'))
for c in j['choices']:
    if c['finish_reason'] == 'stop': assert isinstance(json.loads(c['message']['content']), dict)
" || fail "json_object"
ok "response_format json_object"

# ------------------------------------------------------------------ bad input: JSON 400 naming the field
bad() { # bad PARAM BODY [WORD]
  expect 400 POST /v1/chat/completions "$(jbody "$2")"
  [ "$(jget "j['error']['param']")" = "$1" ] || fail "400 for $1 names param '$(jget "j['error']['param']")': $2"
  [ -z "${3:-}" ] || grep -q -- "$3" "$TMP/resp" || fail "400 for $1 does not mention $3: $(cat "$TMP/resp")"
}
M='"messages":[{"role":"user","content":"x"}]'
bad tools "{$M,\"tools\":{\"type\":\"function\"}}" "array"
bad tools "{$M,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]}" "name"
bad tools "{$M,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}" "parameters"
bad tools "{$M,\"tools\":[{\"type\":\"retrieval\"}]}" "function"
bad tool_choice "{$M,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"sometimes\"}" "sometimes"
bad tool_choice "{$M,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}" "not in 'tools'"
bad tool_choice "{$M,\"tool_choice\":\"required\"}" "needs 'tools'"
bad response_format "{$M,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\",\"pattern\":\"^a\"}}}}" "'pattern'"
bad response_format "{$M,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"strnig\"}}}}" "strnig"
bad response_format "{$M,\"response_format\":{\"type\":\"xml\"}}" "xml"
bad top_logprobs "{$M,\"logprobs\":true,\"top_logprobs\":21}"
bad top_logprobs "{$M,\"top_logprobs\":2}" "logprobs"
bad logit_bias "{$M,\"logit_bias\":{\"99999999\":1}}" "token id"
bad n "{$M,\"n\":17}"
bad reasoning_effort "{$M,\"reasoning_effort\":\"extreme\"}"
bad chat_template_kwargs "{$M,\"chat_template_kwargs\":[1]}"
bad messages "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{not json\"}}]}]}" "arguments"
bad messages "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}" "assistant"
ok "bad tools, tool_choice, schemas, logprobs, logit_bias, n, kwargs, tool_calls: JSON 400 naming the field"

expect 200 GET /health
srv_stop

# ------------------------------------------------------------------ reasoning and template variables (Qwen3.5)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
srv_start --chat-template-file "$ROOT/tests/fixtures/templates/Qwen3.5-4B.jinja"
B='{"messages":[{"role":"user","content":"think first"}],"max_tokens":12,"temperature":0}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
python3 - "$TMP/resp" <<'PY' || fail "Qwen3.5 opens <think> in the generation prompt: the reply is reasoning"
import json, sys
m = json.load(open(sys.argv[1]))["choices"][0]["message"]
assert m.get("reasoning_content") and m["content"] == "", m
PY
expect 200 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"think first"}],"max_tokens":12,"temperature":0,"stream":true}')"
python3 - "$TMP/resp" <<'PY' || fail "streamed reasoning_content"
import json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: {")]
r = "".join(c["delta"].get("reasoning_content", "") for e in ev for c in e["choices"])
t = "".join(c["delta"].get("content", "") for e in ev for c in e["choices"])
assert r and not t, (r, t)
PY
B='{"messages":[{"role":"user","content":"think first"}],"max_tokens":12,"temperature":1,"seed":4,"chat_template_kwargs":{"enable_thinking":false}}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
python3 - "$TMP/resp" <<'PY' || fail "enable_thinking false (chat_template_kwargs): the reply is content"
import json, sys
m = json.load(open(sys.argv[1]))["choices"][0]["message"]
assert m["content"] and not m.get("reasoning_content"), m
PY
B='{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","reasoning_content":"because"},{"role":"user","content":"again"}],"max_tokens":2,"response_format":{"type":"json_object"},"chat_template_kwargs":{"enable_thinking":true}}'
expect 200 POST /v1/chat/completions "$(jbody "$B")"
ok "reasoning_content (prompt-opened <think>, streamed), enable_thinking via chat_template_kwargs, earlier reasoning accepted"
srv_stop

# ------------------------------------------------------------------ a template that raises: 400 with its message
printf '%s' "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('this template has no tool role') }}{% endif %}{{ m.content }}{% endfor %}" >"$TMP/raise.jinja"
srv_start --chat-template-file "$TMP/raise.jinja"
bad messages '{"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"call_1","content":"r"}]}' "this template has no tool role"
expect 200 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"x"}],"max_tokens":2}')"
ok "a template that raises is a 400 naming messages, with the template's message"
srv_stop
echo "agent_api.sh: all ok"
