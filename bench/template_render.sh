#!/usr/bin/env bash
# bench/template_render.sh — time `kvtier template render` (the Jinja interpreter plus the context
# build) on a ~30k-token agent conversation: 50 rounds of user question, assistant tool call, tool
# result and assistant answer, with two tools defined (tool-call arguments as objects). Prints, per template, the prompt's size in
# GPT-2 tokens and the median / best of N renders (`--bench N`, in-process, so no process start-up).
# Goal (issue 25): < 5 ms per render. Usage: bench/template_render.sh [N=50]
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KVTIER:-build/kvtier}
N=${1:-50}
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-bench-tmpl-XXXXXX")
trap 'rm -rf "$T"' EXIT
python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
tools = json.load(open("tests/fixtures/conversations/06-one-tool-call.json"))["tools"]
para = ("The quick brown fox jumps over the lazy dog while the committee reviews the quarterly "
        "figures, and nobody quite remembers who ordered the forty-two pizzas. ")
msgs = [{"role": "system", "content": "You are a careful agent. " + para * 8}]
for r in range(50):
    msgs.append({"role": "user", "content": "Round %d: please check item %d. " % (r, r) + para * 5})
    msgs.append({"role": "assistant", "content": "", "tool_calls": [{"id": "c%08d" % r, "type": "function",
                 "function": {"name": "search", "arguments": {"query": "item %d" % r, "max_results": 3}}}]})
    msgs.append({"role": "tool", "tool_call_id": "c%08d" % r, "name": "search", "content": para * 6})
    msgs.append({"role": "assistant", "content": "Item %d looks fine. " % r + para * 4})
msgs.append({"role": "user", "content": "Summarise everything."})
json.dump(msgs, open(d + "/m.json", "w"))
json.dump(tools, open(d + "/t.json", "w"))
PY
echo "load: $(uptime | sed 's/.*load average/load average/')"
for t in Qwen-Qwen3-0.6B Qwen3-Coder meta-llama-Llama-3.1-8B-Instruct NousResearch-Hermes-3-Llama-3.1-8B-tool_use \
         mistralai-Mistral-Nemo-Instruct-2407 deepseek-ai-DeepSeek-V3.1; do
  f=tests/fixtures/templates/$t.jinja
  "$KV" template render --template "$f" --messages "$T/m.json" --tools "$T/t.json" >"$T/p.txt"
  toks=$("$KV" tokenize -m data/vocab/ggml-vocab-gpt-2.gguf --ids --no-bos -f "$T/p.txt" 2>/dev/null | tr -cd ',' | wc -c)
  r=$("$KV" template render --template "$f" --messages "$T/m.json" --tools "$T/t.json" --bench "$N")
  printf '%-48s %6d tokens  %s\n' "$t" "$((toks + 1))" "${r#template render: }"
done
