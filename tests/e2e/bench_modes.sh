#!/usr/bin/env bash
# e2e: the `kvtier bench` measurement modes used by bench/run-all, on a tiny model with tiny sizes:
# JSON shape and the invariants each mode must show (no timings are asserted):
#   --decode-at: quantized KV takes fewer bytes/token than f16; the pool peak covers the tokens;
#   --agreement: f16 vs f16 (control) agrees 100%; kv8 reports a rate in [0, 1];
#   --kv-quality: every codec and f16 get decode t/s and CPU ms/token from the side-by-side rounds;
#   --once: a second process restores the prompt from the SSD tier (reused_from "ssd");
#   --turns: later turns reuse the previous turn's prefix;
#   --cache: exact repeat reuses the prompt;
#   --membw and the decode bandwidth fields: a positive bandwidth, weight bytes within the file, the
#   KV read of a depth-40 decode, a hybrid model's recurrent state (none for a dense one), and a
#   fraction consistent with bytes x tok/s / bandwidth.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-bench-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok()  { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
check() { local what=$1; shift; if "$@" >/dev/null; then ok "$what"; else bad "$what"; fi; }
command -v jq >/dev/null || { echo "skipped: missing dependency: jq (scripts/install-deps)"; exit 77; }
M=$T/tiny.gguf
"$KV" gen-model --arch llama --shape tiny --type f16 -o "$M" >/dev/null 2>&1 || { echo "FAIL gen-model"; exit 1; }
B=("$KV" bench -m "$M" -t 1 --block-tokens 16 --json)
# quantized-KV steps need a head_dim divisible by the group: the tiny gemma3 shape (head_dim 32)
G=$T/tiny-gemma.gguf
"$KV" gen-model --arch gemma3 --shape tiny --type f16 -o "$G" >/dev/null 2>&1 || { echo "FAIL gen-model gemma3"; exit 1; }
BG=("$KV" bench -m "$G" -t 1 --block-tokens 16 --kv-quant-group 32 --json)

f16=$("${B[@]}" --decode-at 40 -n 4 -r 2 2>/dev/null)
g16=$("${BG[@]}" --decode-at 40 -n 4 -r 1 2>/dev/null)
k4=$("${BG[@]}" --decode-at 40 -n 4 -r 1 --kv-quant 4 2>/dev/null)
check "decode-at emits json" jq -e '.mode == "decode_at" and .depth == 40 and .decode_tps > 0' <<<"$f16"
check "decode-at repeat reuses the prefix" jq -e '.reused_last == 39' <<<"$f16"
check "kv4 bytes/token < f16" test "$(jq -n --argjson a "$g16" --argjson b "$k4" '$b.kv_bytes_per_token_layout < $a.kv_bytes_per_token_layout')" = true
check "pool peak covers the tokens" jq -e '.peak_kv_bytes >= .kv_bytes_per_token_layout * 43' <<<"$f16"
fsz=$(stat -c %s "$M")
check "decode-at: weight and KV bytes read per token" jq -e --argjson fsz "$fsz" '.decode_weight_bytes > 0 and
  .decode_weight_bytes < $fsz and (.decode_kv_bytes_per_token - .kv_bytes_per_token_layout * 42 | fabs) < 1' <<<"$f16"
bw=$("$KV" bench --membw -t 1 -r 2 --membw-mib 64 --json 2>/dev/null)
check "membw json" jq -e '.mode == "membw" and .threads == 1 and .read_gbs > 0 and .triad_gbs > 0 and .runs == 2' <<<"$bw"
tg=$("${B[@]}" -p 8 -n 4 -r 2 --membw-mib 64 2>/dev/null)
check "decode bandwidth fraction" jq -e '.membw_read_gbs > 0 and .decode_bw_fraction > 0 and .decode_state_bytes == 0 and
  ((.decode_weight_bytes + .decode_kv_bytes_per_token) * .decode_tps / (.membw_read_gbs * 1e9) / .decode_bw_fraction | . > 0.2 and . < 5)' <<<"$tg"
# a hybrid model reads its recurrent state every step: counted in the bytes and the fraction
H=$T/tiny-qwen35.gguf
"$KV" gen-model --arch qwen35 --shape tiny --type q8_0 -o "$H" >/dev/null 2>&1 || { echo "FAIL gen-model qwen35"; exit 1; }
for mode in "-p 8" "--decode-at 8"; do
  hs=$("$KV" bench -m "$H" -t 1 --block-tokens 16 --json $mode -n 4 -r 1 --membw-mib 64 2>/dev/null)
  check "recurrent state bytes ($mode)" jq -e '.decode_state_bytes > 0 and .decode_bw_fraction > 0 and
    ((.decode_weight_bytes + .decode_kv_bytes_per_token + .decode_state_bytes) * .decode_tps / (.membw_read_gbs * 1e9)
     / .decode_bw_fraction | . > 0.2 and . < 5)' <<<"$hs"
done
t0=$("${B[@]}" -p 8 -n 4 -r 1 --membw-mib 0 2>/dev/null)
check "membw-mib 0 skips the probe" jq -e '.membw_read_gbs == 0 and .decode_bw_fraction == 0' <<<"$t0"
sw=$("${BG[@]}" --decode-at 400 -n 4 -r 1 --ubatch 16 --prompt-cache 0 2>/dev/null)
check "sliding window: live peak below the computed full cache" jq -e '.window_layers > 0 and .peak_kv_bytes < 0.5 * .full_cache_bytes_computed' <<<"$sw"

ag=$("${BG[@]}" --agreement 12 -p 8 --kv-quant 8 2>/dev/null)
check "agreement kv8 json" jq -e '.results | length == 1 and .[0].rate >= 0 and .[0].rate <= 1 and .[0].match <= 12' <<<"$ag"
ac=$("${BG[@]}" --agreement 12 -p 8 --kv-quant off 2>/dev/null)
check "agreement default runs kv8 and kv4" jq -e '.results | length == 2' <<<"$ac"
# --kv-quality: the codecs' decode timing runs side by side (every codec and f16 get a wall t/s and
# a CPU ms/token), the same prompt comes from the RAM tier after the warm-up round
kq=$("${BG[@]}" --kv-quality 6 -p 8 --kv-quality-ctx 40 -n 3 -r 2 --kv-codecs 8,turbo:k4v3 2>/dev/null)
check "kv-quality json: two codecs, side-by-side timing" jq -e '.mode == "kv_quality" and (.results | length == 2) and
  .speed_reps == 2 and .reference_decode_tps > 0 and .reference_decode_cpu_ms_per_token > 0 and
  all(.results[]; .decode_tps > 0 and .decode_cpu_ms_per_token > 0 and .decode_ratio > 0 and .kl_mean >= 0)' <<<"$kq"

D=$T/ssd
o1=$("${B[@]}" --once -p 50 -n 2 --ssd-cache "$D" 2>/dev/null)
o2=$("${B[@]}" --once -p 50 -n 2 --ssd-cache "$D" 2>/dev/null)
check "once: first process is cold and durable" jq -e '.n_reused == 0 and .durable == true' <<<"$o1"
check "once: restart restores from ssd" jq -e '.reused_from == "ssd" and .n_reused >= 32' <<<"$o2"

tu=$("${B[@]}" --turns 3 -p 20 -n 3 --suffix 10 2>/dev/null)
check "turns: later turns reuse" jq -e '(.turns | length == 3) and .turns[2].n_reused >= 16 and .sum_prompt_tokens == (20 + 33 + 46)' <<<"$tu"

ca=$("${B[@]}" --cache -p 40 --suffix 8 -r 1 2>/dev/null)
check "cache mode json" jq -e '.ttft_cold_ms > 0 and .ttft_repeat_ms > 0' <<<"$ca"

"${B[@]}" --cache --once >/dev/null 2>&1
check "exclusive modes rejected" test $? -eq 2
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all ok"
