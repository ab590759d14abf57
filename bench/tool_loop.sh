#!/usr/bin/env bash
# bench/tool_loop.sh — the agent tool loop of issue 25 (docs/server.md "Tools"): one conversation of
# LOOP_ROUNDS (10) rounds against `kvtier serve --chat-template-file` (Qwen3's template), a system
# prompt of about LOOP_SYS (3000) tokens with the tool definitions, tool_choice "required" (every
# round a constrained call), each call answered by a role "tool" message of about LOOP_RESULT (500)
# tokens. Reports the total wall time, and per round the server's TTFT, prompt tokens, cached_tokens
# and generated tokens (from the response usage and the server's log line). Env: KVTIER, MODEL,
# ARCH, SHAPE, THREADS, LOOP_ROUNDS, LOOP_SYS, LOOP_RESULT, OUT_DIR. Writes $OUT_DIR/tool_loop.json.
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER=${KVTIER:-build/kvtier}
ARCH=${ARCH:-qwen3}
SHAPE=${SHAPE:-smol-135m}
MODEL=${MODEL:-models/$ARCH-$SHAPE-q8_0.gguf}
THREADS=${THREADS:-2}
LOOP_ROUNDS=${LOOP_ROUNDS:-10}
LOOP_SYS=${LOOP_SYS:-3000}
LOOP_RESULT=${LOOP_RESULT:-500}
OUT_DIR=${OUT_DIR:-bench/results}
mkdir -p "$OUT_DIR" "$(dirname "$MODEL")"
[ -f "$MODEL" ] || "$KVTIER" gen-model --arch "$ARCH" --shape "$SHAPE" --type q8_0 --peaked -o "$MODEL" >/dev/null
WORK=$(mktemp -d /tmp/kvtier-loop-bench.XXXXXX)
SRV=""
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$WORK"' EXIT
PORT=$((21000 + RANDOM % 9000))
"$KVTIER" serve -m "$MODEL" --port $PORT -t "$THREADS" --ctx 16384 \
  --chat-template-file tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja >"$WORK/log" 2>&1 &
SRV=$!
for i in $(seq 1 300); do grep -q "^listening on" "$WORK/log" && break; sleep 0.2; done
python3 - "http://127.0.0.1:$PORT" "$WORK/log" "$OUT_DIR/tool_loop.json" "$LOOP_ROUNDS" "$LOOP_SYS" "$LOOP_RESULT" "$MODEL" <<'PY'
import json, re, sys, time, urllib.request
url, log, out, rounds, n_sys, n_res, model = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
words = "cache tier block prefix restore token window agent tool call result reason plan".split()
def text(n):  # about n GPT-2 tokens of plain words
    return " ".join(words[i % len(words)] + str(i % 97) for i in range(n // 2))
tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": text(40),
          "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 24},
                                                          "limit": {"type": "integer"}},
                         "required": ["query", "limit"], "additionalProperties": False}}} for k in range(8)]
msgs = [{"role": "system", "content": text(max(0, n_sys - 8 * 90))}, {"role": "user", "content": "Start the task."}]
rows, t0 = [], time.time()
for r in range(1, rounds + 1):
    body = json.dumps({"messages": msgs, "tools": tools, "tool_choice": "required", "temperature": 0,
                       "max_tokens": 120}).encode()
    ts = time.time()
    j = json.load(urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", body,
                                                                {"Content-Type": "application/json"}), timeout=600))
    wall = time.time() - ts
    line = [l for l in open(log) if "POST /v1/chat/completions 200" in l][-1]
    ttft = float(re.search(r"ttft=([0-9.]+)ms", line).group(1))
    ch = j["choices"][0]; u = j["usage"]
    calls = ch["message"].get("tool_calls") or []
    rows.append({"round": r, "prompt_tokens": u["prompt_tokens"], "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
                 "completion_tokens": u["completion_tokens"], "ttft_ms": ttft, "wall_s": round(wall, 3),
                 "finish_reason": ch["finish_reason"], "calls": len(calls)})
    print(json.dumps(rows[-1]), flush=True)
    msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
    for c in calls:
        msgs.append({"role": "tool", "tool_call_id": c["id"], "content": text(n_res)})
res = {"model": model, "rounds": rows, "total_s": round(time.time() - t0, 2), "system_tokens_approx": n_sys,
       "tool_result_tokens_approx": n_res, "load": open("/proc/loadavg").read().split()[:3]}
json.dump(res, open(out, "w"), indent=1)
print("total", res["total_s"], "s; load", res["load"])
PY
