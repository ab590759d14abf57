#!/usr/bin/env bash
# quantize.sh — `kvtier quantize` on the trained target (data/models): the Q8_0 it writes from the f16
# file scores exactly the perplexity of the Q8_0 file PyTorch's exporter wrote (same quantizer
# arithmetic, independently written); Q4_K_M gets llama-quantize's mix (q4_K, q6_K, and the q5_0 /
# q8_0 fallbacks for rows of 384) and stays within 5% of f16's perplexity; the result serves; usage
# and hostile inputs give clean errors and leave no output. Rules and bytes: tests/test_quantize.c.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
KV=${KV:-$BUILD/kvtier}
D=data/models
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-quantize-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3"; exit 77; }
[ -x "$KV" ] || fail "$KV not built"

ppl() { "$KV" perplexity -m "$1" -f $D/heldout.txt --chunks 8 -t 2 --json 2>"$TMP/err" |
  python3 -c "import json,sys;print(json.load(sys.stdin)['ppl'])" || { cat "$TMP/err"; fail "perplexity $1"; }; }

# 1. Q8_0 from the f16 file == the exporter's Q8_0
"$KV" quantize $D/kjv-target-f16.gguf "$TMP/q8.gguf" --type q8_0 2>"$TMP/log" || { cat "$TMP/log"; fail "quantize q8_0"; }
grep -q "blk.0.attn_q.weight .*f16 *-> q8_0" "$TMP/log" || fail "no per-tensor progress line: $(head -3 "$TMP/log")"
grep -q "58 converted" "$TMP/log" || fail "summary: $(tail -1 "$TMP/log")"
a=$(ppl "$TMP/q8.gguf"); b=$(ppl $D/kjv-target-q8_0.gguf); f=$(ppl $D/kjv-target-f16.gguf)
[ "$a" = "$b" ] || fail "kvtier's Q8_0 perplexity $a differs from the exporter's Q8_0 $b"
ok "Q8_0 written by kvtier scores the exporter's Q8_0 perplexity ($a; f16 $f)"

# 2. Q4_K_M: the mix, the perplexity, and it serves
"$KV" quantize $D/kjv-target-f16.gguf "$TMP/q4m.gguf" --type q4_k_m --quiet 2>"$TMP/log" || { cat "$TMP/log"; fail "quantize q4_k_m"; }
[ "$(grep -c '\->' "$TMP/log")" -eq 1 ] || fail "--quiet still printed per-tensor lines"
"$KV" inspect "$TMP/q4m.gguf" >"$TMP/inspect" 2>&1 || fail "inspect q4_k_m"
for t in q4_K q6_K q5_0; do grep -q "^  $t " "$TMP/inspect" || fail "no $t tensors in the Q4_K_M file: $(cat "$TMP/inspect")"; done
q=$(ppl "$TMP/q4m.gguf")
python3 -c "import sys; q,f=$q,$f; print(f'  Q4_K_M {q:.4f} vs f16 {f:.4f} ({(q/f-1)*100:+.3f}%)'); sys.exit(0 if abs(q/f-1) < 0.05 else 1)" ||
  fail "Q4_K_M perplexity $q is more than 5% from f16's $f"
"$KV" run -m "$TMP/q4m.gguf" -p "In the beginning God created" -n 16 --no-cache -t 2 --json >"$TMP/run.json" 2>"$TMP/err" ||
  { cat "$TMP/err"; fail "run on the Q4_K_M file"; }
python3 -c "import json;r=json.load(open('$TMP/run.json'));assert len(r['tokens'])==16, r" || fail "run output"
ok "Q4_K_M: llama-quantize's mix, perplexity within 5% of f16, generates"

# 3. usage errors (exit 2) and runtime errors (exit 1), no output left behind
"$KV" quantize --help | grep -q "llama-quantize" || fail "--help"
"$KV" quantize >/dev/null 2>&1; [ $? -eq 2 ] || fail "no arguments: exit 2"
"$KV" quantize $D/kjv-draft-f16.gguf "$TMP/x.gguf" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no --type: exit 2"
"$KV" quantize $D/kjv-draft-f16.gguf "$TMP/x.gguf" --type q3_k >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown type: exit 2"
"$KV" quantize "$TMP/none.gguf" "$TMP/x.gguf" --type q8_0 2>"$TMP/err"; [ $? -eq 1 ] || fail "missing input: exit 1"
head -c 100000 $D/kjv-draft-f16.gguf >"$TMP/trunc.gguf"
"$KV" quantize "$TMP/trunc.gguf" "$TMP/x.gguf" --type q8_0 2>"$TMP/err"; [ $? -eq 1 ] || fail "truncated input: exit 1"
grep -q "trunc.gguf" "$TMP/err" || fail "truncated input message: $(cat "$TMP/err")"
"$KV" quantize "$TMP/q8.gguf" "$TMP/x.gguf" --type q4_0 2>"$TMP/err"; [ $? -eq 1 ] || fail "requantize: exit 1"
grep -q "allow-requantize" "$TMP/err" || fail "requantize message: $(cat "$TMP/err")"
"$KV" quantize $D/kjv-draft-f16.gguf "$TMP/no/such/dir/x.gguf" --type q8_0 2>"$TMP/err"; [ $? -eq 1 ] || fail "bad output dir: exit 1"
[ ! -e "$TMP/x.gguf" ] || fail "a failed run left $TMP/x.gguf"
ok "quantize: usage and runtime errors, nothing left behind"
