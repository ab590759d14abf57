#!/usr/bin/env bash
# namespaces.sh — tenant namespaces end to end (issue 28 item 4, docs/server.md "Tenants and
# namespaces"): with --api-keys, KV one tenant computed never serves another — in RAM, from the SSD
# tier after a restart, and from the shared tier (Redis) — and cached_tokens shows only reuse inside
# the caller's own namespace; cache_salt splits namespaces the same way; unknown keys get 401;
# non-admin keys get 403 on /stats, /metrics, /admin/... and the pins; a pin serves its namespace only; /stats lists the namespaces (salts
# hashed) to admins; bad cache_salt values and bad key files are refused with clear messages.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
  fail "redis-server / redis-cli missing (scripts/install-deps installs them)"

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"

KA=alpha-key-0123456789abcdef
KB=beta-key-0123456789abcdef
KOPS=ops-key-0123456789abcdef
MASTER=master-key-0123456789abcdef
KEYS=$TMP/keys
cat >"$KEYS" <<EOF
# kvtier tenants: KEY TENANT [admin]

$KA alpha
$KB   beta
	$KOPS ops admin
EOF
chmod 600 "$KEYS"

# ------------------------------------------------------------------ bad key files (before the model loads)
bad_file() { # WHAT EXPECTED-MESSAGE-REGEX: serve exits 2 naming the problem
  local out rc
  out=$("$KV" serve -m "$MODEL" --port 1 --api-keys "$TMP/bad" 2>&1); rc=$?
  [ "$rc" = 2 ] || fail "$1: serve exited $rc, expected 2 ($out)"
  echo "$out" | grep -Eq "$2" || fail "$1: message '$out' does not match /$2/"
}
printf '%s alpha\n' "$KA" >"$TMP/bad"; chmod 644 "$TMP/bad"
bad_file "world-readable file" "other users can read it .*chmod 600"
printf '# ok\n%s alpha\nshort beta\n' "$KA" >"$TMP/bad"; chmod 600 "$TMP/bad"
bad_file "short key" "bad:3: the key has 5 characters"
printf '%s alpha\n%s beta\n%s alpha admin\n' "$KA" "$KB" "$KA" >"$TMP/bad"
bad_file "duplicate key" "bad:3: this key was already given on line 1"
printf '%s alpha root\n' "$KA" >"$TMP/bad"
bad_file "bad flag" "bad:1: the third field must be 'admin'"
"$KV" serve -m "$MODEL" --port 1 --api-keys "$KEYS" --api-key "$KA" >"$TMP/dup.log" 2>&1
[ $? = 2 ] && grep -q "api-key is also the key on line 3" "$TMP/dup.log" || fail "--api-key equal to a tenant key: $(cat "$TMP/dup.log")"
ok "bad key files refused with the line and the reason"

# ------------------------------------------------------------------ helpers
# 120 token ids per prompt: 7 full blocks of 16 + 8 (--block-tokens 16)
prompt_ids() { python3 -c "import sys; s=int(sys.argv[1]); print(','.join(str(10 + (i * 37 + s * 11) % 240) for i in range(120)))" "$1"; }
P1=$(prompt_ids 1)
P2=$(prompt_ids 2)
P3=$(prompt_ids 3)
# gen KEY PROMPT [SALT-JSON] -> HTTP 200 expected; sets CACHED and FROM
gen() {
  local key=$1 p=$2 salt=${3:-}
  local b="{\"prompt\":[$p],\"max_tokens\":2,\"temperature\":0${salt:+,\"cache_salt\":$salt}}"
  AUTH=(-H "Authorization: Bearer $key")
  expect 200 POST /v1/completions "$(jbody "$b")"
  CACHED=$(jget "j['usage']['prompt_tokens_details']['cached_tokens']")
  FROM=$(jget "j['kvtier']['reused_from']")
  [ "$CACHED" = "$(jget "j['kvtier']['cached_tokens']")" ] || fail "the two cached_tokens differ"
}
cold() { [ "$CACHED" = 0 ] && [ "$FROM" = none ] || fail "$1: expected no reuse, got cached_tokens=$CACHED from $FROM"; }
warm() { [ "$CACHED" -gt 0 ] && [ "$FROM" = "$2" ] || fail "$1: expected reuse from $2, got cached_tokens=$CACHED from $FROM"; }

SSD=$TMP/ssd
srv_start --block-tokens 16 --parallel 1 --api-keys "$KEYS" --api-key "$MASTER" --ssd-cache "$SSD"

# ------------------------------------------------------------------ authentication and authorization
AUTH=()
expect 401 GET /health
AUTH=(-H "Authorization: Bearer not-a-key-0123456789abcdef")
expect 401 GET /health
[ "$(jget "j['error']['code']")" = invalid_api_key ] || fail "401 code"
expect 401 POST /v1/completions "$(jbody '{"prompt":"hi","max_tokens":1}')"
AUTH=(-H "Authorization: Bearer $KA")
expect 200 GET /health
expect 200 GET /v1/models
expect 403 POST /admin/cache/flush
[ "$(jget "j['error']['code']")" = admin_required ] || fail "403 code"
expect 403 GET /stats
expect 403 GET /metrics
expect 403 POST /admin/anything
AUTH=(-H "Authorization: Bearer $KOPS")
expect 200 GET /stats
expect 200 GET /metrics
AUTH=(-H "Authorization: Bearer $MASTER")
expect 200 GET /stats
ok "unknown key 401; tenant key serves but gets 403 on /stats, /metrics, /admin/...; admin keys 200"

# ------------------------------------------------------------------ bad cache_salt
AUTH=(-H "Authorization: Bearer $KA")
for bad in 123 '""' '["x"]' "\"$(python3 -c 'print("s" * 257)')\""; do
  expect 400 POST /v1/completions "$(jbody "{\"prompt\":\"hi\",\"max_tokens\":1,\"cache_salt\":$bad}")"
  [ "$(jget "j['error']['param']")" = cache_salt ] || fail "cache_salt $bad: param $(jget "j['error']['param']")"
done
expect 400 POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"hi"}],"cache_salt":7}')"
[ "$(jget "j['error']['param']")" = cache_salt ] || fail "chat cache_salt param"
gen "$KA" "$P3" "\"$(python3 -c 'print("s" * 256)')\""  # exactly the bound is fine
ok "bad cache_salt -> 400 naming cache_salt"

# ------------------------------------------------------------------ RAM tier: tenants
gen "$KA" "$P1"; cold "alpha first"
gen "$KA" "$P1"; warm "alpha repeat" ram
A_CACHED=$CACHED
gen "$KB" "$P1"; cold "beta after alpha (same prompt)"
gen "$KB" "$P1"; warm "beta repeat" ram
gen "$MASTER" "$P1"; cold "the --api-key admin (no tenant) after alpha and beta"
ok "same prompt: alpha repeat cached $A_CACHED, beta first 0, beta repeat >0, master first 0"

# chat: the same namespaces
CB='{"messages":[{"role":"user","content":"Tell me about the namespaces of a tiered KV cache, in detail please."}],"max_tokens":2,"temperature":0}'
AUTH=(-H "Authorization: Bearer $KA")
expect 200 POST /v1/chat/completions "$(jbody "$CB")"
expect 200 POST /v1/chat/completions "$(jbody "$CB")"
[ "$(jget "j['usage']['prompt_tokens_details']['cached_tokens'] > 0")" = True ] || fail "chat: alpha repeat not reused"
AUTH=(-H "Authorization: Bearer $KB")
expect 200 POST /v1/chat/completions "$(jbody "$CB")"
[ "$(jget "j['usage']['prompt_tokens_details']['cached_tokens'], j['kvtier']['reused_from']")" = "0 none" ] ||
  fail "chat: beta reused alpha's KV: $(cat "$TMP/resp")"
ok "chat: alpha's KV not served to beta"

# ------------------------------------------------------------------ RAM tier: cache_salt
gen "$KA" "$P1" '"s1"'; cold "alpha salt s1 after alpha unsalted"
gen "$KA" "$P1" '"s1"'; warm "alpha salt s1 repeat" ram
gen "$KA" "$P1" '"s2"'; cold "alpha salt s2 after s1"
gen "$KB" "$P1" '"s1"'; cold "beta salt s1 after alpha salt s1"
# without --api-keys the salt alone makes the namespace (the master key has no tenant)
gen "$MASTER" "$P1" '"s1"'; cold "master salt s1"
gen "$MASTER" "$P1" '"s1"'; warm "master salt s1 repeat" ram
ok "cache_salt: a new salt reuses nothing; the same salt of another tenant reuses nothing"

# ------------------------------------------------------------------ pins: admin-only, under the caller's namespace
P4=$(prompt_ids 4)
AUTH=(-H "Authorization: Bearer $KA")
expect 403 POST /v1/cache/pin "$(jbody "{\"prompt\":[$P4]}")"
expect 403 GET /v1/cache/pins
AUTH=(-H "Authorization: Bearer $KOPS") # an admin tenant pins under its own namespace + salt
expect 200 POST /v1/cache/pin "$(jbody "{\"prompt\":[$P4],\"cache_salt\":\"pinned\"}")"
gen "$KOPS" "$P4" '"pinned"'; warm "ops salt pinned after its pin" ram
gen "$KOPS" "$P4"; cold "ops unsalted after its salted pin"
gen "$KA" "$P4" '"pinned"'; cold "alpha with the same salt after ops' pin"
ok "pins: 403 for tenant keys; a pin serves its own namespace (tenant + cache_salt) only"

# ------------------------------------------------------------------ per-namespace stats (admins)
AUTH=(-H "Authorization: Bearer $KOPS")
expect 200 GET /stats
python3 - "$TMP/resp" <<'EOF' || fail "/stats namespaces: $(cat "$TMP/resp")"
import json, sys
j = json.load(open(sys.argv[1]))
ns = j["namespaces"]
rows = {(r["tenant"], r["salt"]): r for r in ns["list"]}
assert ns["max"] == 256 and ns["tracked"] == len(ns["list"]), ns
a = rows[("alpha", None)]
assert a["requests"] >= 4 and a["prompt_tokens"] >= 2 * 120 and a["cached_tokens"] > 0, a
b = rows[("beta", None)]
assert b["requests"] == 3 and b["cached_tokens"] > 0, b
salted = [r for (t, s), r in rows.items() if t == "alpha" and s]
assert len(salted) == 4, rows.keys()  # s1, s2, the 256-byte salt and "pinned"
assert all(len(r["salt"]) == 8 for r in salted)
assert (None, None) in rows  # the master key without salt
raw = open(sys.argv[1]).read()
assert '"s1"' not in raw and "sss" not in raw, "a salt is shown in clear"
total = sum(r["prompt_tokens"] for r in ns["list"]) + ns["other"]["prompt_tokens"]
assert total == j["requests"]["prompt_tokens"], (total, j["requests"]["prompt_tokens"])
EOF
ok "/stats namespaces: per tenant and salt (hashed), sums equal the engine's prompt tokens"

# the per-request log names the tenant and its own reuse only
grep -q "tenant=beta prompt=120 reused=0(none)" "$SRV_LOG" || fail "log line for beta's first request"

# ------------------------------------------------------------------ SSD tier across a restart
gen "$KA" "$P2"; cold "alpha P2"
AUTH=(-H "Authorization: Bearer $KOPS")
expect 200 POST /admin/cache/flush
[ "$(jget "j['durable']")" = True ] || fail "flush not durable"
srv_stop
srv_start --block-tokens 16 --parallel 1 --api-keys "$KEYS" --api-key "$MASTER" --ssd-cache "$SSD"
gen "$KB" "$P2"; cold "beta P2 after restart (alpha's P2 on SSD)"
gen "$KA" "$P2" '"s1"'; cold "alpha salt s1 P2 after restart"
gen "$KA" "$P2"; warm "alpha P2 after restart" ssd
ok "SSD tier: after a restart alpha reuses P2 from SSD, beta and another salt get nothing"
srv_stop

# ------------------------------------------------------------------ shared tier (Redis)
. "$(dirname "$0")/redis_common.bash"
trap 'redis_kill; srv_cleanup' EXIT
redis_start
SH=(--block-tokens 16 --parallel 1 --api-keys "$KEYS" --shared-cache "redis://127.0.0.1:$RPORT")
srv_start "${SH[@]}"
gen "$KA" "$P3"; cold "alpha P3 (shared tier)"
AUTH=(-H "Authorization: Bearer $KOPS")
expect 200 POST "/admin/cache/flush?wait=shared"
[ "$(jget "j['shared']['pending']")" = 0 ] || fail "shared publishes pending"
[ "$(redis-cli -p "$RPORT" dbsize)" -gt 0 ] || fail "nothing in Redis"
srv_stop
srv_start "${SH[@]}" # a fresh process: empty RAM tier, no SSD tier, only Redis holds P3
gen "$KB" "$P3"; cold "beta P3 from a server whose only cache is Redis"
gen "$KA" "$P3" '"s9"'; cold "alpha salted P3 from Redis"
gen "$KA" "$P3"; warm "alpha P3 from Redis" shared
ok "shared tier: alpha's blocks in Redis serve alpha, not beta or another salt"
srv_stop
kill -TERM "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null
echo "PASS namespaces"
