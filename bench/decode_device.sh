#!/bin/bash
# bench/decode_device.sh — the issue-27 check for a borrowed machine with another CPU (the device
# tool's host: 16 cores, AMX): the kernel tests (AMX included), the read bandwidth at 1 and 2
# threads, then llama-1b Q4_K / Q8_0 / BF16 (gen-model) with kvtier and ik_llama.cpp's llama-bench
# interleaved per model, ROUNDS rounds: tg64 on 1 thread, pp512 + tg128 on 2 threads.
# Binaries are carried, not built there (the device image lacks the -dev packages):
#   D=DIR (holds kvtier, test_kernels, llama-bench, libllama.so, libggml.so and lib/ with the
#   runtime libraries of `ldd build/kvtier`); run from the repository root (gen-model reads data/vocab).
# Output: $OUT/results.txt, one line per run: KV1/KV2 (kvtier JSON) and IK1/IK2 (llama-bench CSV).
D=${D:?set D to the folder of carried binaries}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-/tmp}
export LD_LIBRARY_PATH=$D/lib:$D
R=$OUT/results.txt
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|L3|Flags"; } > "$OUT/lscpu.txt" 2>&1
timeout 150 "$D/test_kernels" > "$OUT/test_kernels.txt" 2>&1; echo "test_kernels rc=$?"
for t in q4_k q8_0 bf16; do "$D/kvtier" gen-model --arch llama --shape llama-1b --type $t -o /tmp/l-$t.gguf 2>&1 | tail -2 & done; wait
for th in 1 2; do echo "MEMBW $th $("$D/kvtier" bench --membw -t $th -r 3 --json 2>/dev/null)" >> "$R"; done
for r in $(seq 1 "$ROUNDS"); do
  for t in q4_k q8_0 bf16; do
    m=/tmp/l-$t.gguf
    echo "KV1 $t r=$r $(KVT_REPACK=0 timeout 100 "$D/kvtier" bench -m $m -t 1 -p 16 -n 64 -r 1 --json --membw-mib 0 2>&1 | tail -1)" >> "$R"
    echo "KV2 $t r=$r $(timeout 150 "$D/kvtier" bench -m $m -t 2 -p 512 -n 128 -r 1 --json --membw-mib 0 2>&1 | tail -1)" >> "$R"
    echo "IK1 $t r=$r $(timeout 100 "$D/llama-bench" -m $m -t 1 -p 0 -n 64 -r 1 -o csv 2>&1 | tail -1)" >> "$R"
    echo "IK2 $t r=$r $(timeout 150 "$D/llama-bench" -m $m -t 2 -p 512 -n 128 -r 1 -o csv 2>&1 | tail -2 | tr '\n' ' ')" >> "$R"
  done
done
