#!/usr/bin/env bash
# trained_models.sh — the trained models in data/models/ (scripts/train-models) against their README
# and the PyTorch references: SHA-256 sums as listed in data/models/README.md; kvtier's SPM tokenizer
# gives sentencepiece's ids on the held-out text (heldout-ids.txt); `kvtier perplexity` on the f16
# files is within 0.1% of PyTorch's (the windows kjv-*-ref.json names); the Q8_0 files within 2%
# of their f16 twins; a greedy --chat answer of the target (repeat penalty 1.3: an undertrained
# model loops without one) is KJV-like English. Log-prob and greedy
# parity: tests/test_trained.c.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
KV=${KV:-$BUILD/kvtier}
D=data/models
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-trained-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3"; exit 77; }
[ -x "$KV" ] || fail "$KV not built"

# 1. every file the README lists has its SHA-256; every committed model file is listed
grep -E '^[0-9a-f]{64}  [A-Za-z0-9._-]+$' $D/README.md >"$TMP/sums"
[ "$(wc -l <"$TMP/sums")" -ge 8 ] || fail "README lists $(wc -l <"$TMP/sums") sums, expected the models, tokenizer, texts and references"
(cd $D && sha256sum --quiet -c "$TMP/sums") || fail "SHA-256 sums differ from data/models/README.md"
for f in $D/*.gguf $D/tokenizer.model $D/heldout.txt; do
  grep -q "  $(basename "$f")\$" "$TMP/sums" || fail "$f has no SHA-256 line in the README"
done
ok "SHA-256 sums of $(wc -l <"$TMP/sums") files match the README"

# 2. tokenizer: kvtier == sentencepiece on the whole held-out text (both GGUF flavours of both models)
for m in kjv-target-q8_0 kjv-target-f16 kjv-draft-q8_0; do
  "$KV" tokenize -m $D/$m.gguf --ids -f $D/heldout.txt 2>/dev/null >"$TMP/ids.txt" || fail "tokenize $m"
  cmp -s "$TMP/ids.txt" $D/heldout-ids.txt || fail "$m: kvtier's token ids differ from sentencepiece's (heldout-ids.txt)"
done
ok "SPM tokenizer: $(python3 -c "import json;print(len(json.load(open('$D/heldout-ids.txt'))))") held-out ids identical to sentencepiece"

# 3. perplexity parity with PyTorch (f16, 0.1%) and Q8_0 near f16 (2%)
for m in target draft; do
  want=$(python3 -c "import json;r=json.load(open('$D/kjv-$m-ref.json'))['perplexity'];print(r['ppl'],r['ctx'],r['chunks'])")
  set -- $want
  KVT_BF16X=0 "$KV" perplexity -m $D/kjv-$m-f16.gguf -f $D/heldout.txt --ctx "$2" --chunks "$3" -t 2 --json \
    >"$TMP/p16.json" 2>"$TMP/err" || { cat "$TMP/err"; fail "perplexity $m f16"; }
  "$KV" perplexity -m $D/kjv-$m-q8_0.gguf -f $D/heldout.txt --ctx "$2" --chunks "$3" -t 2 --json \
    >"$TMP/p8.json" 2>"$TMP/err" || { cat "$TMP/err"; fail "perplexity $m q8_0"; }
  python3 - "$1" "$TMP/p16.json" "$TMP/p8.json" "$m" <<'PY' || fail "perplexity $m"
import json, sys
ref = float(sys.argv[1]); f16 = json.load(open(sys.argv[2])); q8 = json.load(open(sys.argv[3]))
d16 = abs(f16["ppl"] / ref - 1); d8 = abs(q8["ppl"] / f16["ppl"] - 1)
print(f"  {sys.argv[4]}: PyTorch {ref:.4f}  kvtier f16 {f16['ppl']:.4f} ({d16*100:.4f}%)  Q8_0 {q8['ppl']:.4f} ({d8*100:.3f}% from f16)")
assert f16["scored"] == f16["chunks"] * (f16["ctx"] - 1 - f16["ctx"] // 2)
assert d16 < 1e-3, "f16 perplexity more than 0.1% from PyTorch"
assert d8 < 2e-2, "Q8_0 perplexity more than 2% from f16"
PY
done
ok "perplexity: f16 within 0.1% of PyTorch, Q8_0 within 2% of f16 (target and draft)"

# perplexity's usage and runtime errors: clean messages and exit codes, no crash
"$KV" perplexity --help | grep -q "second half" || fail "perplexity --help does not state the method"
"$KV" perplexity -m $D/kjv-draft-q8_0.gguf >/dev/null 2>&1; [ $? -eq 2 ] || fail "perplexity without -f: exit 2"
"$KV" perplexity -m $D/kjv-draft-q8_0.gguf -f "$TMP/none.txt" 2>"$TMP/err" >/dev/null; [ $? -eq 1 ] || fail "missing file: exit 1"
grep -q "cannot open" "$TMP/err" || fail "missing file message"
printf 'In the beginning' >"$TMP/short.txt"
"$KV" perplexity -m $D/kjv-draft-q8_0.gguf -f "$TMP/short.txt" 2>"$TMP/err" >/dev/null; [ $? -eq 1 ] || fail "short text: exit 1"
grep -q "fewer than one window" "$TMP/err" || fail "short text message: $(cat "$TMP/err")"
"$KV" perplexity -m $D/kjv-draft-q8_0.gguf -f "$TMP" 2>"$TMP/err" >/dev/null; [ $? -eq 1 ] || fail "directory as text: exit 1"
"$KV" perplexity -m $D/kjv-draft-q8_0.gguf -f $D/heldout.txt --kv-quant 3 2>"$TMP/err" >/dev/null; [ $? -eq 1 ] || fail "bad --kv-quant: exit 1"
ok "perplexity: usage and runtime errors"

# 4. the demo reads like its corpus: a greedy chat answer of the target is English words, mostly KJV's
"$KV" run -m $D/kjv-target-q8_0.gguf --chat -p "And God said, Let there be light: and there was light." -n 40 \
  --repeat-penalty 1.3 --no-cache -t 2 --json 2>/dev/null >"$TMP/chat.json" || fail "run --chat"
python3 - "$TMP/chat.json" $D/heldout.txt <<'PY' || fail "chat answer does not read like the corpus"
import json, re, sys
r = json.load(open(sys.argv[1])); text = r["text"]
vocab = set(re.findall(r"[A-Za-z]+", open(sys.argv[2]).read().lower()))
words = re.findall(r"[A-Za-z]+", text)
known = sum(w.lower() in vocab for w in words)
print(f"  chat answer: {text!r} ({known}/{len(words)} words from the held-out KJV text)")
assert len(words) >= 8 and len({w.lower() for w in words}) >= 5 and known >= 0.8 * len(words)
PY
ok "--chat answers in KJV English"
