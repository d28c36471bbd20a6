// OpenAI's `n` through the official OpenAI Node SDK against `dsv4 serve` on the tiny-a fixture:
// the choices of one request are forked from one prefill, and choice i is bit for bit (text,
// log-probabilities, finish reason) what a separate request with seed + i gives; streamed,
// every chunk carries its choice's index; usage counts the prompt once.
// Run: node tests/node/server_choices.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { binaryFromArgs, startServer } from "./server_harness.mjs";

const binary = binaryFromArgs();
let server;
let client;

before(async () => {
  // Two slots for three choices: two run side by side, the third waits for a slot.
  server = await startServer(binary, ["--parallel", "2"]);
  client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
});

after(async () => {
  assert.equal(await server.stop(), 0, "the server shuts down cleanly on SIGTERM:\n" + server.stderr());
});

const withoutIndex = ({ index, ...rest }) => rest;

test("chat: each of n = 3 choices is its seed's answer alone, streamed and not", async () => {
  const body = { model: "tiny-a", messages: [{ role: "user", content: "Tell me a story about a ship." }],
    temperature: 0.9, seed: 1234, max_tokens: 12, logprobs: true, top_logprobs: 2 };
  const r = await client.chat.completions.create({ ...body, n: 3 });
  assert.equal(r.choices.length, 3);
  let completion = 0;
  for (let i = 0; i < 3; ++i) {
    assert.equal(r.choices[i].index, i);
    const alone = await client.chat.completions.create({ ...body, seed: body.seed + i });
    assert.deepEqual(withoutIndex(r.choices[i]), withoutIndex(alone.choices[0]), `choice ${i}`);
    assert.equal(r.usage.prompt_tokens, alone.usage.prompt_tokens);
    completion += alone.usage.completion_tokens;
  }
  assert.equal(new Set(r.choices.map((c) => c.message.content)).size, 3);
  assert.equal(r.usage.completion_tokens, completion);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + completion);

  // Streamed: chunks name their choice; each adds up to that choice.
  const stream = await client.chat.completions.create({ ...body, n: 3, stream: true, stream_options: { include_usage: true } });
  const text = ["", "", ""];
  const logprobs = [[], [], []];
  const finish = [null, null, null];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text[c.index] += c.delta?.content ?? "";
      logprobs[c.index].push(...(c.logprobs?.content ?? []));
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  for (let i = 0; i < 3; ++i) {
    assert.equal(text[i], r.choices[i].message.content);
    assert.deepEqual(logprobs[i], r.choices[i].logprobs.content);
    assert.equal(finish[i], r.choices[i].finish_reason);
  }
  assert.equal(usage.completion_tokens, completion);
  // The SDK's stream helper keeps the choices apart too.
  const final = await client.chat.completions.stream({ ...body, n: 3 }).finalChatCompletion();
  assert.deepEqual(final.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
});

test("completions: n = 2 choices are their seeds' answers alone", async () => {
  const body = { model: "tiny-a", prompt: "Once upon a time", temperature: 1, seed: 77, max_tokens: 10, logprobs: 2 };
  const r = await client.completions.create({ ...body, n: 2 });
  assert.equal(r.choices.length, 2);
  for (let i = 0; i < 2; ++i) {
    const alone = await client.completions.create({ ...body, seed: body.seed + i });
    assert.deepEqual(withoutIndex(r.choices[i]), withoutIndex(alone.choices[0]), `choice ${i}`);
  }
  const text = ["", ""];
  for await (const chunk of await client.completions.create({ ...body, n: 2, stream: true }))
    for (const c of chunk.choices) text[c.index] += c.text;
  assert.deepEqual(text, r.choices.map((c) => c.text));
});

test("n out of bounds is a 400 naming n", async () => {
  for (const n of [0, 17]) {
    await assert.rejects(
      client.chat.completions.create({ model: "tiny-a", messages: [{ role: "user", content: "hi" }], n }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "n" && /\bn\b|at (least|most)/.test(e.message));
  }
});
