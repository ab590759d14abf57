#!/usr/bin/env bash
# e2e: `kvtier gen-model` for every arch (tiny) + `kvtier inspect`, determinism, an independent
# layout check of the written files (Python, ggml-strict rules), and one-line errors for bad files.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-gen-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok()   { echo "ok   $*"; }
bad()  { echo "FAIL $*"; fails=$((fails+1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
command -v python3 >/dev/null || { echo "skipped: missing dependency: python3 (scripts/install-deps)"; exit 77; }

# Independent reader: checks the GGUF v3 layout rules other readers (ggml) rely on.
layout_check() {
  python3 - "$1" <<'PY'
import struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); o = 0
def rd(f):
    global o; v = struct.unpack_from('<' + f, b, o); o += struct.calcsize('<' + f); return v[0]
def rs():
    n = rd('Q'); global o; s = b[o:o+n]; o += n; return s.decode('utf-8')
SZ = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def val(t):
    if t == 8: return rs()
    if t == 9:
        et = rd('I'); n = rd('Q'); assert et != 9
        return [val(et) for _ in range(n)]
    return rd(SZ[t])
assert rd('I') == 0x46554747 and rd('I') == 3
nt, nkv = rd('Q'), rd('Q'); kv = {}
for _ in range(nkv):
    k = rs(); assert k not in kv; kv[k] = val(rd('I'))
align = kv.get('general.alignment', 32)
BLK = {0:(1,4),1:(1,2),30:(1,2),2:(32,18),6:(32,22),7:(32,24),8:(32,34),12:(256,144),13:(256,176),14:(256,210)}
ts = []
for _ in range(nt):
    name = rs(); nd = rd('I'); ne = [rd('Q') for _ in range(nd)]; ty = rd('I'); off = rd('Q')
    be, bs = BLK[ty]; assert ne[0] % be == 0, name
    n = 1
    for x in ne: n *= x
    ts.append((name, off, n // be * bs))
data = (o + align - 1) // align * align
run = 0
for name, off, size in ts:
    assert off == run, (name, off, run)   # offsets are running padded sums
    run = (off + size + align - 1) // align * align
assert data + run == len(b), (data, run, len(b))
arch = kv['general.architecture']
assert len(kv['tokenizer.ggml.tokens']) > 0
assert kv[arch + '.embedding_length'] > 0
PY
}

for arch in llama qwen2 qwen3 gemma3 qwen3moe deepseek2; do
  f=$T/$arch.gguf
  check "gen-model $arch tiny" "$KV" gen-model --arch $arch --shape tiny --type q8_0 --seed 3 -o "$f"
  out=$("$KV" inspect "$f"); rc=$?
  check "inspect $arch exit 0" test $rc -eq 0
  check "inspect $arch architecture" grep -q "^architecture: *$arch\$" <<<"$out"
  check "inspect $arch kv bytes" grep -q "^kv per token: *[1-9][0-9]* bytes at f16" <<<"$out"
  check "inspect $arch q8_0 tensors" grep -q "q8_0 .* tensors" <<<"$out"
  check "layout $arch" layout_check "$f"
  check "inspect --json $arch" python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["architecture"]==sys.argv[1] and j["kv_bytes_per_token_f16"]>0 and j["tensors"]["count"]>0' $arch < <("$KV" inspect --json "$f")
done
check "gemma3 windowed note" grep -q "windowed" < <("$KV" inspect "$T/gemma3.gguf")
check "qwen chatml hint" grep -q "^chat template: chatml" < <("$KV" inspect "$T/qwen3.gguf")
check "gemma template hint" grep -q "^chat template: gemma" < <("$KV" inspect "$T/gemma3.gguf")

# determinism: same args, same bytes
"$KV" gen-model --arch gemma3 --shape tiny --type q8_0 --seed 3 -o "$T/again.gguf"
check "deterministic bytes" cmp -s "$T/gemma3.gguf" "$T/again.gguf"

# a real shape with the K-quant fallback (Q4_K rows of 576 fall back to Q5_0)
check "gen-model smol-135m q4_k" "$KV" gen-model --shape smol-135m --type q4_k -o "$T/smol.gguf"
out=$("$KV" inspect "$T/smol.gguf")
check "smol q4_K + q5_0 fallback" bash -c 'grep -q "q4_K " <<<"$1" && grep -q "q5_0 " <<<"$1" && grep -q "n_layer 30" <<<"$1"' _ "$out"
check "layout smol" layout_check "$T/smol.gguf"

# errors: exit 1 and exactly one line on stderr
one_line_err() { # expected-substring file
  "$KV" inspect "$2" >/dev/null 2>"$T/err"; local rc=$?
  [ $rc -eq 1 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "$1" "$T/err"
}
printf 'GGUF\001\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000' >"$T/v1.gguf"
check "v1 rejected" one_line_err "version 1" "$T/v1.gguf"
printf 'NOPE and some more bytes to pass the size check' >"$T/magic.gguf"
check "bad magic rejected" one_line_err "bad magic" "$T/magic.gguf"
head -c 3000 "$T/llama.gguf" >"$T/trunc.gguf"
check "truncated rejected" one_line_err "truncated at KV" "$T/trunc.gguf"
sz=$(stat -c %s "$T/llama.gguf"); head -c $((sz - 100)) "$T/llama.gguf" >"$T/short.gguf"
check "short data rejected" one_line_err "beyond end of file" "$T/short.gguf"
check "missing file" one_line_err "cannot open" "$T/does-not-exist.gguf"

# usage errors exit 2
"$KV" gen-model --arch gpt9 -o "$T/x.gguf" 2>/dev/null; check "unknown arch exit 2" test $? -eq 2
"$KV" gen-model --shape tiny 2>/dev/null; check "missing -o exit 2" test $? -eq 2
"$KV" gen-model --layers 0 -o "$T/x.gguf" 2>/dev/null; check "--layers 0 exit 2" test $? -eq 2
"$KV" gen-model --arch deepseek2 --layers 1 -o "$T/x.gguf" 2>/dev/null; check "deepseek2 with only its dense layer refused" test $? -eq 1
"$KV" gen-model --arch llama --shape deepseek2-lite -o "$T/x.gguf" 2>/dev/null; check "MoE shape on a dense arch refused" test $? -eq 1
check "qwen3moe --layers 2" "$KV" gen-model --arch qwen3moe --layers 2 -o "$T/l2.gguf"
check "qwen3moe --layers 2 has 2 blocks" grep -q "n_layer 2 " <<<"$("$KV" inspect "$T/l2.gguf")"
"$KV" inspect --bogus "$T/llama.gguf" 2>/dev/null; check "inspect unknown flag exit 2" test $? -eq 2
"$KV" gen-model --help >/dev/null; check "gen-model --help exit 0" test $? -eq 0

# the vocabulary comes from the repository's data/vocab (found from the executable's location, not
# the working directory); a binary with no data/vocab beside it fails clearly instead of falling
# back to a byte vocabulary, which it makes only when asked (--byte-vocab)
(kva=$(realpath "$KV") && cd "$T" && "$kva" gen-model --shape tiny -o "$T/cwd.gguf" >/dev/null 2>&1); check "default vocab from another cwd" test $? -eq 0
check "default vocab is GPT-2 (50257 tokens)" grep -q 50257 <("$KV" inspect "$T/cwd.gguf" 2>&1)
mkdir -p "$T/alone/bin" && cp "$KV" "$T/alone/bin/kvtier"
env -u KVT_VOCAB_DIR "$T/alone/bin/kvtier" gen-model --shape tiny -o "$T/alone/x.gguf" 2>"$T/alone/err"
check "no vocabulary: exit 1" test $? -eq 1
check "no vocabulary: clear error" grep -q "no vocabulary found.*--byte-vocab" "$T/alone/err"
check "no vocabulary: no file written" test ! -e "$T/alone/x.gguf"
"$T/alone/bin/kvtier" gen-model --shape tiny --byte-vocab -o "$T/alone/b.gguf" >/dev/null 2>&1; check "--byte-vocab works alone" test $? -eq 0
KVT_VOCAB_DIR="$PWD/data/vocab" "$T/alone/bin/kvtier" gen-model --shape tiny -o "$T/alone/v.gguf" >/dev/null 2>&1; check "KVT_VOCAB_DIR honoured" test $? -eq 0
"$KV" gen-model --byte-vocab --vocab data/vocab/ggml-vocab-gpt-2.gguf -o "$T/y.gguf" 2>/dev/null; check "--vocab with --byte-vocab exit 2" test $? -eq 2

echo "$fails failure(s)"
[ $fails -eq 0 ]
