#!/usr/bin/env bash
# spec_state.sh — the draft's state in the tiers (issue 29, docs/speculative.md "The draft's state in
# the tiers"), on the trained pair (data/models) with an SSD tier:
#   1. a server with the draft answers a long prompt; a second prompt extending it reuses the draft's
#      state from the draft's RAM tier; a flush is durable for both models' blocks; the SSD root
#      holds two compat directories (the target's, the draft's);
#   2. after a restart with the same draft, the same request restores the target's and the draft's
#      state from SSD: the draft recomputes nothing (draft_state.recomputed_tokens 0), its restored
#      tokens equal the target's, the answer equals the one before the restart, and the draft proposes
#      exactly what it did then (the same rounds and accepted tokens: its restored KV is the computed);
#   3. a server with another draft (the f16 file of the same draft: another SHA-256) reuses the
#      target's blocks but no draft block: it recomputes the draft and counts that;
#   4. a server without a draft reuses the target's blocks as well (speculative is null);
#   5. the first draft again still finds its own state (the other configurations left it alone);
#   6. idle demotion (--ssd-demote-idle 1) moves the draft's RAM-tier state to its SSD tier too.
set -u
. "$(dirname "$0")/server_common.bash"
need_py
need curl
[ -x "$KV" ] || fail "$KV not built"
cd "$(dirname "$0")/../.."
MODEL=data/models/kjv-target-q8_0.gguf
DRAFT=data/models/kjv-draft-q8_0.gguf
OTHER=data/models/kjv-draft-f16.gguf
SSD=$TMP/ssd
SPEC=(--draft-max 4 --draft-p-min 0 --threads 2 --ssd-cache "$SSD" --block-tokens 64)

python3 - "$TMP" <<'PY'
import json, sys
t = open("data/models/heldout.txt").read()
a, b = t[:1100], t[:1700]
for name, p in (("a", a), ("b", b)):
    json.dump({"prompt": p, "max_tokens": 24, "temperature": 0}, open(f"{sys.argv[1]}/{name}.json", "w"))
PY
ask() { # ask NAME -> the answer's text in $TMP/NAME.out, usage in $TMP/NAME.usage
  expect 200 POST /v1/completions "$TMP/$1.json"
  python3 -c "import json; j=json.load(open('$TMP/resp')); open('$TMP/$2.out','w').write(j['choices'][0]['text']); json.dump(j['usage'], open('$TMP/$2.usage','w'))"
}
stat() { expect 200 GET /stats; jget "$1"; }
DS="j['speculative']['draft_state']"

# 1. first server: compute, extend, flush
srv_start --draft-model "$DRAFT" "${SPEC[@]}"
ask a a1
[ "$(stat "$DS['recomputed_tokens'] == 0 and $DS['reused_ram_tokens'] == 0")" = True ] || fail "cold: $(stat "$DS")"
rounds1=$(stat "(j['speculative']['rounds'], j['speculative']['accepted_tokens'])")
ask b b1
[ "$(stat "$DS['reused_ram_tokens'] >= 64")" = True ] || fail "the extended prompt did not reuse the draft's RAM state: $(stat "$DS")"
[ "$(stat "$DS['recomputed_tokens'] == 0")" = True ] || fail "the draft recomputed what the target reused: $(stat "$DS")"
expect 200 POST /admin/cache/flush
[ "$(jget "j['durable']")" = True ] || fail "flush not durable: $(cat "$TMP/resp")"
[ "$(stat "$DS['ssd_entries'] > 0 and $DS['ram_bytes'] > 0")" = True ] || fail "no draft state in the tiers: $(stat "$DS")"
echo "  first server: $(stat "$DS")"
srv_stop TERM
n_dirs=$(find "$SSD" -mindepth 1 -maxdepth 1 -type d | wc -l)
[ "$n_dirs" = 2 ] || fail "expected 2 compat directories (target, draft), found $n_dirs"

# 2. restart, same draft: both from SSD, no draft prefill, the same answer
srv_start --draft-model "$DRAFT" "${SPEC[@]}"
ask a a2
cmp -s "$TMP/a1.out" "$TMP/a2.out" || fail "answer after the restart differs: $(cat "$TMP/a1.out") / $(cat "$TMP/a2.out")"
reused=$(python3 -c "import json; print(json.load(open('$TMP/a2.usage'))['prompt_tokens_details']['cached_tokens'])")
[ "$reused" -gt 0 ] || fail "the target reused nothing after the restart"
[ "$(stat "$DS['recomputed_tokens'] == 0 and $DS['recompute_rows'] == 0")" = True ] || fail "the draft recomputed after the restart: $(stat "$DS")"
[ "$(stat "$DS['reused_ssd_tokens'] == $reused")" = True ] || fail "draft restored != target restored ($reused): $(stat "$DS")"
# the restored draft state proposes what the computed one did: the same rounds and acceptances
rounds2=$(stat "(j['speculative']['rounds'], j['speculative']['accepted_tokens'])")
[ "$rounds1" = "$rounds2" ] || fail "(rounds, accepted) before/after the restart: $rounds1 / $rounds2"
expect 200 GET /metrics
grep -q '^kvtier_spec_draft_reused_ssd_tokens_total [1-9]' "$TMP/resp" || fail "/metrics lacks the draft's SSD reuse"
srv_stop TERM
ok "restart: target and draft state ($reused tokens) from SSD, no draft recompute, the same answer"

# 3. another draft: target reuse, no draft reuse, recompute counted
srv_start --draft-model "$OTHER" "${SPEC[@]}"
ask a a3
cmp -s "$TMP/a1.out" "$TMP/a3.out" || fail "answer with another draft differs"
[ "$(stat "$DS['reused_ssd_tokens'] + $DS['reused_ram_tokens'] + $DS['reused_shared_tokens'] == 0")" = True ] ||
  fail "another draft read the first draft's state: $(stat "$DS")"
[ "$(stat "$DS['recomputed_tokens'] == $reused and $DS['recompute_rows'] == 1")" = True ] ||
  fail "the recompute was not counted: $(stat "$DS")"
[ "$(stat "j['ssd_cache']['restores'] > 0")" = True ] || fail "target reuse lost with another draft"
srv_stop TERM
ok "another draft: target reused, draft recomputed ($reused tokens) and counted"

# 4. no draft: target reuse intact
srv_start "${SPEC[@]:4}"
ask a a4
cmp -s "$TMP/a1.out" "$TMP/a4.out" || fail "answer without a draft differs"
[ "$(stat "j['speculative'] is None and j['ssd_cache']['restores'] > 0")" = True ] || fail "no target reuse without a draft"
srv_stop TERM

# 5. the first draft again: its state is still there
srv_start --draft-model "$DRAFT" "${SPEC[@]}"
ask b b5
cmp -s "$TMP/b1.out" "$TMP/b5.out" || fail "extended answer after the restarts differs"
[ "$(stat "$DS['reused_ssd_tokens'] > 0 and $DS['recomputed_tokens'] == 0")" = True ] || fail "first draft's state lost: $(stat "$DS")"
srv_stop TERM

# 6. idle demotion: the draft's RAM tier empties into its SSD tier like the target's
srv_start --draft-model "$DRAFT" "${SPEC[@]}" --ssd-demote-idle 1
ask b b6
for i in $(seq 1 100); do
  [ "$(stat "$DS['ram_bytes'] == 0 and j['prompt_cache']['bytes'] == 0")" = True ] && break
  sleep 0.1
done
[ "$(stat "$DS['ram_bytes'] == 0 and $DS['ssd_entries'] > 0")" = True ] || fail "the draft's RAM state was not demoted: $(stat "$DS")"
srv_stop TERM
ok "the draft's state in the tiers: RAM reuse, SSD restore after restarts, isolation by draft identity, idle demotion"
