#!/usr/bin/env bash
# e2e (issue 31.1): the model file is rewritten in place (same inode, `dd conv=notrunc`) while a
# server with an SSD tier runs. The server must refuse every request after the rewrite with a 503
# naming the model file, /stats and /health must say so, a flush must not bring any record computed
# after the rewrite to disk, and after the original bytes are restored and the server restarted the
# greedy output must equal a cold run's. Loopback only; every wait is bounded.
set -u
. "$(dirname "$0")/server_common.bash"
need python3 curl dd cmp
MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 --seed 1 -o "$TMP/a.gguf" >/dev/null 2>&1 || fail "gen-model a"
"$KV" gen-model --arch llama --shape tiny --type f16 --seed 2 -o "$TMP/b.gguf" >/dev/null 2>&1 || fail "gen-model b"
[ "$(stat -c %s "$TMP/a.gguf")" = "$(stat -c %s "$TMP/b.gguf")" ] || fail "the two models differ in size"
cmp -s "$TMP/a.gguf" "$TMP/b.gguf" && fail "the two seeds gave the same file"
cp "$TMP/a.gguf" "$MODEL"
INO=$(stat -c %i "$MODEL")
# overwrite FILE with SRC in place: same inode, no truncation
inplace() { dd if="$1" of="$MODEL" bs=1M conv=notrunc status=none || fail "dd $1"; [ "$(stat -c %i "$MODEL")" = "$INO" ] || fail "inode changed"; }

# prompts: token ids (several full 16-token blocks), greedy
ids() { python3 -c "import random; r=random.Random($1); print(','.join(str(r.randrange(300, 900)) for _ in range(90)))"; }
P1=$(jbody "{\"prompt\":[$(ids 1)],\"max_tokens\":12,\"temperature\":0}"); cp "$P1" "$TMP/p1.json"
P2=$(jbody "{\"prompt\":[$(ids 2)],\"max_tokens\":12,\"temperature\":0}"); cp "$P2" "$TMP/p2.json"
gen_text() { expect 200 POST /v1/completions "$1"; jget "j['choices'][0]['text']" >"$2"; }
records() { find "$1" -type f \( -name '*.kvb' -o -name '*.kvt' -o -name '*.kvs' -o -name '*.kvc' \) -printf '%P\n' | sort; }
ARGS=(--block-tokens 16 --parallel 1 --ssd-cache "$TMP/cache")

# 1. cold reference for P2 (no cache at all)
srv_start --block-tokens 16 --parallel 1 --prompt-cache 0
gen_text "$TMP/p2.json" "$TMP/ref.txt"
srv_stop
ok "cold reference"

# 2. a server with the SSD tier; P1 computed and flushed while the file is intact
srv_start "${ARGS[@]}"
gen_text "$TMP/p1.json" "$TMP/p1.txt"
expect 200 POST /admin/cache/flush
records "$TMP/cache" >"$TMP/before.txt"
[ -s "$TMP/before.txt" ] || fail "no record on disk after the first flush"

# 3. rewrite the model in place (another seed, same shape): every request is refused
inplace "$TMP/b.gguf"
http POST /v1/completions "$TMP/p2.json"
[ "$HTTP_CODE" = 503 ] || fail "request after the rewrite: HTTP $HTTP_CODE (want 503)"
[ "$(jget "j['error']['code']")" = model_changed ] || fail "error code after the rewrite"
jget "j['error']['message']" | grep -q "m.gguf" || fail "the error does not name the model file"
http POST /v1/chat/completions "$(jbody '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0}')"
[ "$HTTP_CODE" = 503 ] || fail "chat after the rewrite: HTTP $HTTP_CODE (want 503)"
cat >"$TMP/s.json" <<EOF
{"prompt":[$(ids 3)],"max_tokens":8,"temperature":0,"stream":true}
EOF
http POST /v1/completions "$TMP/s.json"
[ "$HTTP_CODE" = 503 ] || fail "streamed request after the rewrite: HTTP $HTTP_CODE (want 503)"
http GET /health
[ "$HTTP_CODE" = 503 ] || fail "/health after the rewrite: HTTP $HTTP_CODE (want 503)"
expect 200 GET /stats
[ "$(jget "j['model_file']['state']")" = changed ] || fail "/stats model_file after the rewrite"
ok "requests refused after the in-place rewrite: $(jget "j['model_file']['change']")"
grep -c "changed while it was in use" "$SRV_LOG" | grep -qx 1 || fail "the change is not logged exactly once"

# 4. a flush writes nothing computed after the rewrite
http POST /admin/cache/flush
records "$TMP/cache" >"$TMP/after.txt"
NEW=$(comm -13 "$TMP/before.txt" "$TMP/after.txt" | wc -l)
[ "$NEW" = 0 ] || fail "$NEW record(s) written after the rewrite: $(comm -13 "$TMP/before.txt" "$TMP/after.txt" | head -3 | tr '\n' ' ')"
srv_stop
ok "no record written after the rewrite ($(wc -l <"$TMP/before.txt") before, $(wc -l <"$TMP/after.txt") after)"

# 5. restore the original bytes in place, restart: the output equals the cold run
inplace "$TMP/a.gguf"
cmp -s "$TMP/a.gguf" "$MODEL" || fail "restore"
srv_start "${ARGS[@]}"
gen_text "$TMP/p2.json" "$TMP/after_restart.txt"
cmp -s "$TMP/ref.txt" "$TMP/after_restart.txt" || fail "output after restore+restart differs from the cold run: '$(cat "$TMP/after_restart.txt")' vs '$(cat "$TMP/ref.txt")'"
gen_text "$TMP/p1.json" "$TMP/p1b.txt"
cmp -s "$TMP/p1.txt" "$TMP/p1b.txt" || fail "P1 (cached before the rewrite) differs after restart"
expect 200 GET /stats
[ "$(jget "j['model_file']['state']")" = unchanged ] || fail "/stats model_file after restart"
srv_stop
ok "after restore + restart: greedy output equals the cold run"
echo "PASS model_rewrite"
