#!/usr/bin/env bash
# spec.sh — speculative decoding (docs/speculative.md) through the CLI: bad --draft-* values exit 2
# (or 1 for what only the engine can judge) with a message naming the flag; a draft with another
# vocabulary is refused naming the first differing token; on the trained pair (data/models) greedy
# `run` output is identical without a draft and with --draft-max 4 and 8, and the draft's
# proposals are really accepted there (and, proposing everywhere, often rejected and rolled back).
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
KV=${KV:-$BUILD/kvtier}
D=data/models
T=$D/kjv-target-q8_0.gguf
DR=$D/kjv-draft-q8_0.gguf
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-spec-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3"; exit 77; }
[ -x "$KV" ] || fail "$KV not built"

# 1. bad values: exit 2 and the flag's name (usage errors), exit 1 for the engine's checks
expect() { # expect CODE 'MESSAGE' ARGS...: kvtier run ARGS exits CODE and says MESSAGE
  local code=$1 msg=$2; shift 2
  "$KV" run -m $T -p x -n 1 -t 2 "$@" >/dev/null 2>"$TMP/e"; local rc=$?
  [ $rc -eq "$code" ] || fail "run $*: exit $rc, expected $code ($(cat "$TMP/e"))"
  grep -qF -- "$msg" "$TMP/e" || fail "run $*: message '$(cat "$TMP/e")' lacks '$msg'"
}
expect 2 "--draft-max, --draft-min, --draft-p-min and --draft-threads need --draft-model FILE" --draft-max 4
expect 2 "bad value '0' for --draft-threads: expected an integer in [1, 512]" --draft-model $DR --draft-threads 0
expect 2 "bad value '0' for --draft-max: expected an integer in [1, 64]" --draft-model $DR --draft-max 0
expect 2 "bad value '65' for --draft-max: expected an integer in [1, 64]" --draft-model $DR --draft-max 65
expect 2 "--draft-min 5 is more than --draft-max 4" --draft-model $DR --draft-max 4 --draft-min 5
expect 2 "bad value '1.5' for --draft-p-min: expected a number in [0, 1]" --draft-model $DR --draft-p-min 1.5
expect 1 "--draft-max 64 needs --ubatch of at least 130 (got 64)" --draft-model $DR --draft-max 64 --ubatch 64
expect 1 "--draft-model $TMP/none.gguf" --draft-model "$TMP/none.gguf"
ok "bad --draft-* values refused with the flag's name"

# 2. another vocabulary (the GPT-2 vocabulary of a generated model): a startup error naming the token
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$TMP/gpt2.gguf" >/dev/null 2>&1 || fail "gen-model"
expect 1 "the draft model's vocabulary differs from the target's at token " --draft-model "$TMP/gpt2.gguf"
ok "vocabulary mismatch: $(grep -o "the draft model's vocabulary differs.*" "$TMP/e")"

# 3. the trained pair: greedy output identical with and without the draft, proposals accepted
P="And it came to pass, when the king heard the words of the law, that he rent his clothes."
"$KV" run -m $T -p "$P" -n 96 -t 2 --no-cache --json 2>/dev/null >"$TMP/plain.json" || fail "run without a draft"
for dm in 4 8; do # --draft-max 8 proposes everywhere (--draft-p-min 0): many rejections, many rollbacks
  pm=0.5; [ $dm -eq 8 ] && pm=0
  "$KV" run -m $T -p "$P" -n 96 -t 2 --no-cache --json --draft-model $DR --draft-max $dm --draft-p-min $pm \
    2>"$TMP/err" >"$TMP/spec$dm.json" || fail "run --draft-max $dm: $(cat "$TMP/err")"
  python3 - "$TMP/plain.json" "$TMP/spec$dm.json" "$dm" <<'PY' || fail "--draft-max $dm"
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
assert a["tokens"] == b["tokens"], f"tokens differ:\n{a['text']!r}\n{b['text']!r}"
s = b["speculative"]
rate = s["accepted"] / max(1, s["proposed"])
print(f"  --draft-max {sys.argv[3]}: {len(b['tokens'])} tokens identical; {s['accepted']}/{s['proposed']} proposals "
      f"accepted in {s['rounds']} rounds; decode {a['timings']['decode_tps']:.1f} -> {b['timings']['decode_tps']:.1f} tok/s")
assert s["rounds"] > 0 and s["accepted"] > 0 and s["rounds"] < len(b["tokens"])
PY
done
ok "trained pair: greedy output identical with the draft"
