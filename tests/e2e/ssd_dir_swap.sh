#!/usr/bin/env bash
# ssd_dir_swap.sh — issue 31 item 2, with the real server: while it runs, the compat directory
# <cache>/<compat> is moved away and a symlink to another directory put in its place (then another
# real directory). New requests must not write anything at the symlink's target (nor in the
# replacement directory, nor in the moved-away one), /admin/cache/flush must answer 503 with the
# reason, and the server keeps serving. Moving the directory back makes the owed records durable,
# and a restart reuses them.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"

MODEL=$TMP/m.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$MODEL" >/dev/null 2>&1 || fail "gen-model failed"
mkdir -p "$TMP/cache" "$TMP/target"
body() { python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1] * 10, 'max_tokens': 6, 'temperature': 0}))" "$1" >"$TMP/$2.json"; }
body "The quick brown fox jumps over the lazy dog. " a
body "A completely different prompt about sailing ships and the sea. " b
body "Yet another text, this one on mountains, rivers and old maps. " c
nfiles() { find "$1" -type f 2>/dev/null | wc -l; }
# exchange two paths in one step (renameat2 RENAME_EXCHANGE): the compat path never goes missing,
# so the writer's retries cannot find it gone and recreate it in between (which it does, by design,
# for a directory that vanished)
exchange() {
    python3 -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, sys.argv[1].encode(), -100, sys.argv[2].encode(), 2) != 0:
    sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))' "$1" "$2"
}

srv_start --ssd-cache "$TMP/cache"
expect 200 POST /v1/completions "$TMP/a.json"
expect 200 POST /admin/cache/flush "$(jbody '{}')"
[ "$(jget "j['durable']")" = True ] || fail "first flush not durable"
CD=$(find "$TMP/cache" -mindepth 1 -maxdepth 1 -type d | head -1)
[ -n "$CD" ] || fail "no compat directory under $TMP/cache"

# swap: the compat dir moved away, a symlink to $TMP/target in its place
ln -s "$TMP/target" "$TMP/moved"
exchange "$TMP/moved" "$CD" || fail "could not exchange the directory for a symlink"
MOVED0=$(nfiles "$TMP/moved")
expect 200 POST /v1/completions "$TMP/b.json"
B1=$(jget "j['choices'][0]['text']")
expect 200 POST /v1/completions "$TMP/c.json"
http POST /admin/cache/flush "$(jbody '{}')"
[ "$HTTP_CODE" = 503 ] || fail "flush after the swap: HTTP $HTTP_CODE, expected 503: $(cat "$TMP/resp")"
[ "$(nfiles "$TMP/target")" -eq 0 ] || fail "$(nfiles "$TMP/target") files written through the symlink"
[ "$(nfiles "$TMP/moved")" -eq "$MOVED0" ] || fail "files written into the moved-away directory"
jget "'replaced' in j['reason'] or sys.exit(1)" >/dev/null || fail "flush reason does not name the swap: $(cat "$TMP/resp")"
ok "swap for a symlink: flush 503 ($(jget "j['reason']")), 0 files at the target"

# another real directory in its place: refused the same way
mkdir -m 700 "$TMP/replacement"
exchange "$TMP/replacement" "$CD" || fail "could not exchange the symlink for a directory"
rm "$TMP/replacement" # the symlink, now under that name
expect 200 POST /v1/completions "$TMP/c.json"
http POST /admin/cache/flush "$(jbody '{}')"
[ "$HTTP_CODE" = 503 ] || fail "flush with a replacement directory: HTTP $HTTP_CODE"
[ "$(nfiles "$CD")" -eq 0 ] || fail "files written into the replacement directory"
ok "swap for another directory: flush 503, nothing written there"

# moved back: the owed records are written and durable, and survive a restart
exchange "$TMP/moved" "$CD" || fail "could not move the directory back"
rmdir "$TMP/moved" # the replacement directory, now under that name
expect 200 POST /admin/cache/flush "$(jbody '{}')"
[ "$(jget "j['durable']")" = True ] || fail "flush after restoring the directory not durable"
expect 200 POST /v1/completions "$TMP/a.json" # still serving
srv_stop TERM
[ "$(nfiles "$TMP/target")" -eq 0 ] || fail "files at the target after shutdown"
srv_start --ssd-cache "$TMP/cache"
expect 200 POST /v1/completions "$TMP/b.json"
[ "$(jget "j['choices'][0]['text']")" = "$B1" ] || fail "output after restart differs"
RC=$(jget "j['usage']['prompt_tokens_details']['cached_tokens']")
[ "$RC" -gt 0 ] || fail "the records owed during the swap were not reused after restart"
srv_stop TERM
ok "restored directory: durable flush, $RC cached tokens after restart"

# kvtier cache prune: a compat dir that is a symlink (to cache files elsewhere) is not followed
mkdir -p "$TMP/outside"
cp "$(find "$CD" -name '*.kv[bt]' | head -1)" "$TMP/outside/" || fail "no cache file to copy"
ln -s "$TMP/outside" "$TMP/cache/0123456789abcdef0123456789abcdef"
"$KV" cache prune "$TMP/cache" --max-gb 0 >"$TMP/prune.log" 2>&1 || fail "cache prune: $(cat "$TMP/prune.log")"
[ "$(nfiles "$TMP/outside")" -eq 1 ] || fail "cache prune deleted a file through a symlinked compat dir"
[ "$(find "$CD" -name '*.kv[bt]' | wc -l)" -eq 0 ] || fail "cache prune left files in the real compat dir"
ok "cache prune: nothing deleted through a symlinked compat dir"
echo "PASS ssd_dir_swap"
