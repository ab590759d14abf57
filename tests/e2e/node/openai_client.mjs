// openai_client.mjs — drives `kvtier serve` with the official `openai` package: models list, chat
// (non-streaming and streaming with include_usage), completions, multi-turn cached_tokens, and the
// client's error class for a bad request. Usage: node openai_client.mjs BASE_URL [API_KEY]
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.argv[2];
const apiKey = process.argv[3] || "no-key";
const client = new OpenAI({ baseURL, apiKey, timeout: 120_000, maxRetries: 0 });

async function step(name, fn) {
  await fn();
  console.log(`ok: ${name}`);
}

const models = await client.models.list();
const modelId = models.data[0].id;
await step("models.list", async () => assert.ok(modelId.length > 0));

const user = { role: "user", content: "Hello from the official OpenAI client, please tell me a story." };
let first;
await step("chat non-streaming", async () => {
  first = await client.chat.completions.create({ model: modelId, messages: [user], temperature: 0, max_tokens: 12 });
  assert.equal(first.object, "chat.completion");
  assert.equal(first.choices[0].message.role, "assistant");
  assert.equal(typeof first.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(first.choices[0].finish_reason));
  const u = first.usage;
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, "number");
});

await step("chat streaming with include_usage", async () => {
  const stream = await client.chat.completions.create({
    model: modelId, messages: [user], temperature: 0, max_tokens: 12, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, first.choices[0].message.content);
  assert.ok(["stop", "length"].includes(finish));
  assert.ok(usage, "usage chunk missing");
  assert.equal(usage.prompt_tokens, first.usage.prompt_tokens);
  // the same prompt was just served: the cache must supply (nearly) all of it
  assert.ok(usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 1,
            `cached ${usage.prompt_tokens_details.cached_tokens} of ${usage.prompt_tokens}`);
});

await step("multi-turn cached_tokens", async () => {
  const second = await client.chat.completions.create({
    model: modelId, temperature: 0, max_tokens: 6,
    messages: [user, { role: "assistant", content: first.choices[0].message.content },
               { role: "user", content: "What happened next?" }],
  });
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= first.usage.prompt_tokens - 1, `cached ${cached} < ${first.usage.prompt_tokens} - 1`);
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
});

await step("completions", async () => {
  const c = await client.completions.create({ model: modelId, prompt: "Once upon a time", max_tokens: 5, temperature: 0 });
  assert.equal(c.object, "text_completion");
  assert.equal(typeof c.choices[0].text, "string");
  assert.ok(c.usage.completion_tokens <= 5);
});

await step("errors map to the client's error classes", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "no-such-model", messages: [user] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(
    client.chat.completions.create({ model: modelId, messages: [user], max_tokens: 1_000_000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === "context_length_exceeded");
});

console.log("PASS openai_client.mjs");
