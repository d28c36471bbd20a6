// The official OpenAI Node SDK against `dsv4 serve` on the tiny-a fixture: the client people
// actually use. Greedy answers are checked against `dsv4 run`, and the tool-conversation
// prompt against the official DeepSeek-V4 encoding golden (tests/data/dsv4_encoding).
// Run: node tests/node/server_openai_sdk.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { binaryFromArgs, startServer, runCli, tokenize } from "./server_harness.mjs";

const binary = binaryFromArgs();
const LIGHTHOUSE = "Tell me about the lighthouse keeper and his cat.";
let server;
let client;

before(async () => {
  // Pace decoding a little so that streaming is observable as several chunks even when the
  // machine is busy (the server coalesces text produced between two writes).
  server = await startServer(binary, [], { DSV4_TEST_TOKEN_DELAY_MS: "15" });
  client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
});

after(async () => {
  assert.equal(await server.stop(), 0, "the server shuts down cleanly on SIGTERM:\n" + server.stderr());
});

test("models.list names the served model", async () => {
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, "tiny-a");
  assert.equal(models[0].object, "model");
  assert.equal((await client.models.retrieve("tiny-a")).id, "tiny-a");
});

test("non-streaming chat equals dsv4 run (greedy), with usage", async () => {
  const cli = runCli(binary, ["--temperature", "0", "--max-tokens", "12", LIGHTHOUSE]);
  const r = await client.chat.completions.create({
    model: "tiny-a",
    messages: [{ role: "user", content: LIGHTHOUSE }],
    temperature: 0,
    max_tokens: 12,
  });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(r.choices[0].message.content, cli.text);
  assert.equal(r.choices[0].finish_reason, cli.finish_reason);
  assert.equal(r.usage.prompt_tokens, cli.prompt_tokens.length);
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(r.usage.total_tokens, cli.prompt_tokens.length + 12);
});

test("streaming chat: deltas add up to the non-streaming answer; include_usage", async () => {
  const body = { model: "tiny-a", messages: [{ role: "user", content: LIGHTHOUSE }], temperature: 0, max_completion_tokens: 16 };
  const whole = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = "";
  let contentChunks = 0;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.delta.content) {
      text += choice.delta.content;
      ++contentChunks;
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.ok(contentChunks > 2, `streamed in ${contentChunks} pieces`);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(
    { p: usage.prompt_tokens, c: usage.completion_tokens },
    { p: whole.usage.prompt_tokens, c: whole.usage.completion_tokens });

  // The SDK's own stream accumulator agrees too.
  const runner = client.chat.completions.stream(body);
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, whole.choices[0].message.content);
});

test("tool conversation: accepted, and the prompt is the official V4 encoding", async () => {
  const golden = JSON.parse(readFileSync("tests/data/dsv4_encoding/test_input_1.json", "utf8"));
  const expectedText = readFileSync("tests/data/dsv4_encoding/test_output_1.txt", "utf8");
  // The conversation up to the tool result; the model is to write the last assistant turn.
  const messages = golden.messages.slice(0, -1).map(({ reasoning, ...m }) =>
    reasoning === undefined ? m : { ...m, reasoning_content: reasoning });
  assert.equal(messages.at(-1).role, "tool");
  const marker = "<｜Assistant｜><think>";
  const prompt = expectedText.slice(0, expectedText.lastIndexOf(marker) + marker.length);
  const expectedTokens = tokenize(binary, prompt).length;

  const r = await client.chat.completions.create({
    model: "tiny-a",
    messages,
    tools: golden.tools,
    tool_choice: "auto",
    reasoning_effort: "high",
    max_tokens: 4,
    temperature: 0,
  });
  assert.equal(r.usage.prompt_tokens, expectedTokens);
  assert.ok(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason));
  assert.equal(typeof r.choices[0].message.reasoning_content, "string");

  // Streaming takes the same request; tool_choice "none" leaves the tool schemas out.
  const stream = await client.chat.completions.create({
    model: "tiny-a", messages, tools: golden.tools, reasoning_effort: "high", max_tokens: 3, stream: true,
    stream_options: { include_usage: true },
  });
  let usage = null;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  assert.equal(usage.prompt_tokens, expectedTokens);
  const none = await client.chat.completions.create({
    model: "tiny-a", messages, tools: golden.tools, tool_choice: "none", reasoning_effort: "high", max_tokens: 1,
  });
  assert.ok(none.usage.prompt_tokens < expectedTokens - 100, `${none.usage.prompt_tokens} vs ${expectedTokens}`);
});

test("usage: the second turn of a chat reuses the first turn's prompt and answer", async () => {
  const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: LIGHTHOUSE }];
  const first = await client.chat.completions.create({ model: "tiny-a", messages, temperature: 0, max_tokens: 10 });
  messages.push({ role: "assistant", content: first.choices[0].message.content });
  messages.push({ role: "user", content: "What was the cat's name?" });
  const second = await client.chat.completions.create({ model: "tiny-a", messages, temperature: 0, max_tokens: 4 });
  // Everything the first request fed (its prompt and all answer tokens but the last one).
  assert.equal(second.usage.prompt_tokens_details.cached_tokens,
    first.usage.prompt_tokens + first.usage.completion_tokens - 1);
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens);
});

test("completions: text and token prompts, equal to dsv4 run --raw", async () => {
  const cli = runCli(binary, ["--temperature", "0", "--max-tokens", "8", "--raw", "the cat"]);
  const r = await client.completions.create({ model: "tiny-a", prompt: "the cat", max_tokens: 8, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices[0].text, cli.text);
  assert.equal(r.usage.prompt_tokens, cli.prompt_tokens.length);
  const byIds = await client.completions.create({ model: "tiny-a", prompt: cli.prompt_tokens, max_tokens: 8, temperature: 0 });
  assert.equal(byIds.choices[0].text, cli.text);
  let streamed = "";
  for await (const chunk of await client.completions.create({
    model: "tiny-a", prompt: "the cat", max_tokens: 8, temperature: 0, stream: true,
  })) streamed += chunk.choices[0]?.text ?? "";
  assert.equal(streamed, cli.text);
});

test("sampling: a seed makes answers repeatable; stop strings end them", async () => {
  const ask = (extra) => client.chat.completions.create({
    model: "tiny-a", messages: [{ role: "user", content: LIGHTHOUSE }], max_tokens: 16, ...extra,
  });
  const a = await ask({ temperature: 1, seed: 7 });
  const b = await ask({ temperature: 1, seed: 7 });
  const c = await ask({ temperature: 1, seed: 8 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);

  const full = (await ask({ temperature: 0 })).choices[0].message.content;
  const stop = [...full].slice(3, 5).join("");  // two characters from the middle
  const cut = await ask({ temperature: 0, stop: [stop] });
  assert.equal(cut.choices[0].message.content, full.slice(0, full.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, "stop");
});

test("errors come as the SDK's typed errors with status, code and param", async () => {
  // Any model id is answered by the served model (unless --strict-model).
  const other = await client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "hi" }], max_tokens: 1 });
  assert.equal(other.model, "tiny-a");
  await assert.rejects(
    client.chat.completions.create({ model: "tiny-a", messages: [{ role: "user", content: "hi" }], max_tokens: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "max_tokens" && /max_tokens/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: "tiny-a", messages: [{ role: "pirate", content: "arr" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "messages[0].role");
  await assert.rejects(
    client.chat.completions.create({ model: "tiny-a", messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "messages");
});

test("an API key is enforced when the server has one", async () => {
  const guarded = await startServer(binary, ["--api-key", "k-123"]);
  try {
    const wrong = new OpenAI({ baseURL: guarded.url + "/v1", apiKey: "nope", maxRetries: 0 });
    await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
    const right = new OpenAI({ baseURL: guarded.url + "/v1", apiKey: "k-123", maxRetries: 0 });
    const r = await right.chat.completions.create({ model: "tiny-a", messages: [{ role: "user", content: "hi" }], max_tokens: 2,
      temperature: 0 });  // greedy: sampled, the end token can come first
    assert.equal(r.usage.completion_tokens, 2);
  } finally {
    assert.equal(await guarded.stop(), 0);
  }
});
