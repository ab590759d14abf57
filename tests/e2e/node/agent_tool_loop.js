// agent_tool_loop.js — an agent's tool loop through the official `openai` npm client (run by
// tests/e2e/agent_node.sh, once per chat template). Rounds FROM..TO of one conversation whose state
// (messages, last usage) lives in STATE_FILE, so the script can stop, the server restart, and the
// loop continue. Each round: tool_choice "required" (round 3: a named function) -> the reply is a
// call whose arguments are valid against the tool's schema; the same request streamed and assembled
// by the SDK gives the same calls; cached_tokens >= the previous round's prompt less the re-rendered
// tail; the application answers each call with a role "tool" message.
// Usage: node agent_tool_loop.js BASE_URL STATE_FILE FROM TO [MIN_CACHED_FIRST]
import assert from "node:assert/strict";
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, stateFile, fromS, toS] = process.argv.slice(2);
const from = Number(fromS), to = Number(toS);
const client = new OpenAI({ baseURL, apiKey: "no-key", timeout: 120_000, maxRetries: 0 });
const SLACK = 3; // tokens at the prompt boundary that may tokenize differently once text follows

const tools = [
  { type: "function", function: { name: "get_weather", description: "Current weather for a city, in the unit asked for.",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["c", "f"] } },
                  required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "add", description: "Adds two integers.",
    parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } },
                  required: ["a", "b"], additionalProperties: false } } },
];

function checkArgs(name, args) {
  const t = tools.find((x) => x.function.name === name);
  assert.ok(t, `unknown function ${name}`);
  const p = t.function.parameters;
  assert.deepEqual(Object.keys(args).sort(), [...p.required].sort(), `${name} arguments keys`);
  for (const [k, s] of Object.entries(p.properties)) {
    const v = args[k];
    if (s.type === "string") assert.ok(typeof v === "string" && [...v].length <= s.maxLength, `${k}: ${v}`);
    if (s.type === "integer") assert.ok(Number.isInteger(v), `${k}: ${v}`);
    if (s.enum) assert.ok(s.enum.includes(v), `${k}: ${v}`);
  }
}

const system = "You are an agent with tools. " + "Use the tools to answer; think about units and cities. ".repeat(20);
let st = fs.existsSync(stateFile) ? JSON.parse(fs.readFileSync(stateFile, "utf8"))
  : { messages: [{ role: "system", content: system }, { role: "user", content: "What is the weather in Paris, and 2+3?" }], last: null };
const models = await client.models.list();
const model = models.data[0].id;

for (let round = from; round <= to; round++) {
  const tool_choice = round === 3 ? { type: "function", function: { name: "add" } } : "required";
  const body = { model, messages: st.messages, tools, tool_choice, temperature: 0, max_tokens: 160 };
  const r = await client.chat.completions.create(body);
  const ch = r.choices[0];
  assert.equal(ch.finish_reason, "tool_calls", `round ${round}: finish_reason ${ch.finish_reason} (${ch.message.content})`);
  const calls = ch.message.tool_calls;
  assert.ok(calls && calls.length >= 1, `round ${round}: no tool calls`);
  if (round === 3) assert.equal(calls[0].function.name, "add");
  for (const c of calls) {
    assert.equal(c.type, "function");
    assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
    checkArgs(c.function.name, JSON.parse(c.function.arguments));
  }
  const u = r.usage;
  if (st.last) {
    const need = st.last.prompt_tokens - SLACK;
    assert.ok(u.prompt_tokens_details.cached_tokens >= need,
      `round ${round}: cached_tokens ${u.prompt_tokens_details.cached_tokens} < previous prompt ${st.last.prompt_tokens} - ${SLACK}`);
  }
  // the same request streamed, assembled by the SDK
  const stream = client.beta.chat.completions.stream({ ...body, stream: true });
  const fin = await stream.finalChatCompletion();
  const sc = fin.choices[0];
  assert.equal(sc.finish_reason, "tool_calls", `round ${round}: streamed finish_reason`);
  assert.deepEqual(sc.message.tool_calls.map((c) => [c.function.name, c.function.arguments]),
    calls.map((c) => [c.function.name, c.function.arguments]), `round ${round}: streamed calls differ`);
  console.log(`ok: round ${round}: ${calls.map((c) => c.function.name + c.function.arguments).join(" ")} ` +
    `prompt ${u.prompt_tokens} cached ${u.prompt_tokens_details.cached_tokens} gen ${u.completion_tokens}`);
  st.messages.push({ role: "assistant", content: null, tool_calls: calls.map((c) => ({ id: c.id, type: "function", function: c.function })) });
  for (const c of calls)
    st.messages.push({ role: "tool", tool_call_id: c.id, content: JSON.stringify({ ok: true, round, result: `value ${round} for ${c.function.name}` }) });
  st.last = u;
}
fs.writeFileSync(stateFile, JSON.stringify(st));
