// The official Anthropic Node SDK against `dsv4 serve` on the tiny-a fixture: what Claude-style
// clients send. Greedy answers are checked against `dsv4 run`, a tool conversation's prompt
// against the official DeepSeek-V4 encoding golden, streams against the non-streaming message,
// count_tokens against the usage, and errors against the SDK's typed errors.
// Run: node tests/node/server_anthropic_sdk.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import Anthropic from "@anthropic-ai/sdk";
import { binaryFromArgs, startServer, runCli, tokenize } from "./server_harness.mjs";

const binary = binaryFromArgs();
const LIGHTHOUSE = "Tell me about the lighthouse keeper and his cat.";
// Claude-style clients send their own model ids; the server answers them with its model.
const MODEL = "claude-sonnet-4-5";
let server;
let client;

before(async () => {
  // Pace decoding a little so that streaming is observable as several events.
  server = await startServer(binary, [], { DSV4_TEST_TOKEN_DELAY_MS: "10" });
  client = new Anthropic({ baseURL: server.url, apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
});

after(async () => {
  assert.equal(await server.stop(), 0, "the server shuts down cleanly on SIGTERM:\n" + server.stderr());
});

// The official golden tool conversation (tests/data/dsv4_encoding/test_input_1.json) in
// Anthropic's shape, up to the tool result: the model is to write the last assistant turn.
function goldenToolConversation() {
  const golden = JSON.parse(readFileSync("tests/data/dsv4_encoding/test_input_1.json", "utf8"));
  const tools = golden.tools.map(({ function: f }) => ({ name: f.name, description: f.description, input_schema: f.parameters }));
  const messages = [];
  let system;
  for (const m of golden.messages.slice(0, -1)) {
    if (m.role === "system") system = m.content;
    else if (m.role === "user") messages.push({ role: "user", content: m.content });
    else if (m.role === "tool") messages.push({ role: "user", content: [{ type: "tool_result", tool_use_id: m.tool_call_id, content: m.content }] });
    else {
      messages.push({
        role: "assistant",
        content: [
          { type: "thinking", thinking: m.reasoning, signature: "" },
          ...m.tool_calls.map((c) => ({ type: "tool_use", id: c.id, name: c.function.name, input: JSON.parse(c.function.arguments) })),
        ],
      });
    }
  }
  const text = readFileSync("tests/data/dsv4_encoding/test_output_1.txt", "utf8");
  const marker = "<｜Assistant｜><think>";
  const prompt = text.slice(0, text.lastIndexOf(marker) + marker.length);
  return { system, tools, messages, promptTokens: tokenize(binary, prompt).length };
}

test("messages.create equals dsv4 run (greedy), answered as the served model, with usage", async () => {
  const cli = runCli(binary, ["--temperature", "0", "--max-tokens", "12", LIGHTHOUSE]);
  const m = await client.messages.create({
    model: MODEL, max_tokens: 12, temperature: 0, messages: [{ role: "user", content: LIGHTHOUSE }],
  });
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.equal(m.model, "tiny-a");
  assert.match(m.id, /^msg_/);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, "text");
  assert.equal(m.content[0].text, cli.text);
  assert.equal(m.stop_reason, cli.finish_reason === "length" ? "max_tokens" : "end_turn");
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, cli.prompt_tokens.length);
  assert.equal(m.usage.output_tokens, 12);
});

test("streaming: the documented event sequence, adding up to the non-streaming message", async () => {
  const body = { model: MODEL, max_tokens: 16, temperature: 0, system: [{ type: "text", text: "You are terse." }],
    messages: [{ role: "user", content: [{ type: "text", text: LIGHTHOUSE, cache_control: { type: "ephemeral" } }] }] };
  const whole = await client.messages.create(body);
  const events = [];
  for await (const e of await client.messages.create({ ...body, stream: true })) events.push(e);
  const types = events.map((e) => e.type);
  assert.equal(types[0], "message_start");
  assert.equal(types.at(-2), "message_delta");
  assert.equal(types.at(-1), "message_stop");
  assert.deepEqual(types.filter((t) => t.startsWith("content_block_") && t !== "content_block_delta"),
    ["content_block_start", "content_block_stop"]);
  const deltas = events.filter((e) => e.type === "content_block_delta");
  assert.ok(deltas.length > 2, `streamed in ${deltas.length} pieces`);
  assert.ok(deltas.every((d) => d.delta.type === "text_delta" && d.index === 0));
  assert.equal(deltas.map((d) => d.delta.text).join(""), whole.content[0].text);
  const last = events.at(-2);
  assert.equal(last.delta.stop_reason, whole.stop_reason);
  assert.equal(last.usage.output_tokens, whole.usage.output_tokens);

  // The SDK's own accumulator agrees too.
  const final = await client.messages.stream(body).finalMessage();
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.input_tokens + final.usage.cache_read_input_tokens,
    whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
});

test("thinking: the answer starts with a thinking block, streamed as thinking_delta", async () => {
  const body = { model: MODEL, max_tokens: 10, temperature: 0, thinking: { type: "adaptive" },
    messages: [{ role: "user", content: LIGHTHOUSE }] };
  const m = await client.messages.create(body);
  assert.equal(m.content[0].type, "thinking");
  assert.equal(typeof m.content[0].signature, "string");
  const final = await client.messages.stream(body).finalMessage();
  assert.deepEqual(final.content, m.content);
  await assert.rejects(
    client.messages.create({ ...body, thinking: { type: "enabled", budget_tokens: 1024 } }),
    (e) => e instanceof Anthropic.BadRequestError && /budget_tokens/.test(e.message));  // not below max_tokens
});

test("tool use round trip: tool_use -> tool_result -> answer, encoded as the official golden", async () => {
  const { system, tools, messages, promptTokens } = goldenToolConversation();
  const body = { model: MODEL, max_tokens: 6, temperature: 0, system, tools, messages, thinking: { type: "adaptive" } };
  const answer = await client.messages.create(body);
  assert.equal(answer.usage.input_tokens + answer.usage.cache_read_input_tokens, promptTokens);
  assert.equal(answer.content[0].type, "thinking");
  assert.ok(["end_turn", "max_tokens", "tool_use"].includes(answer.stop_reason));
  const counted = await client.messages.countTokens({ model: MODEL, system, tools, messages, thinking: { type: "adaptive" } });
  assert.equal(counted.input_tokens, promptTokens);
  // The answer goes back into the conversation as the client would send it next turn.
  const next = await client.messages.create({
    ...body, messages: [...messages, { role: "assistant", content: answer.content }, { role: "user", content: "Thanks!" }],
  });
  assert.ok(next.usage.cache_read_input_tokens > 0, "the second turn reuses the first turn's prefix");

  // A forced call is constrained to a tool-call block (its inputs validated against the schemas
  // in server_constrained.test.mjs): with room to finish, the answer is that one tool_use.
  const forced = await client.messages.create({ model: MODEL, max_tokens: 200, temperature: 0, tools,
    tool_choice: { type: "tool", name: "get_weather" }, messages: [{ role: "user", content: "Weather in Paris?" }] });
  assert.ok(["max_tokens", "tool_use"].includes(forced.stop_reason));
  if (forced.stop_reason === "tool_use") {
    assert.equal(forced.content.length, 1);
    assert.equal(forced.content[0].type, "tool_use");
    assert.equal(forced.content[0].name, "get_weather");
  }
  // tool_choice none: the tool schemas stay in the prompt (the same prefix as with auto).
  const auto = await client.messages.countTokens({ model: MODEL, tools, messages: [{ role: "user", content: "Hi" }] });
  const none = await client.messages.countTokens({ model: MODEL, tools, tool_choice: { type: "none" }, messages: [{ role: "user", content: "Hi" }] });
  assert.equal(none.input_tokens, auto.input_tokens);
});

test("count_tokens equals the prompt the answer was generated from", async () => {
  const messages = [{ role: "user", content: LIGHTHOUSE }, { role: "assistant", content: "Once" }];
  const counted = await client.messages.countTokens({ model: MODEL, system: "Be kind.", messages });
  const m = await client.messages.create({ model: MODEL, max_tokens: 3, temperature: 0, system: "Be kind.", messages });
  assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

test("stop_sequences end the answer with stop_reason stop_sequence", async () => {
  const full = await client.messages.create({ model: MODEL, max_tokens: 16, temperature: 0, messages: [{ role: "user", content: LIGHTHOUSE }] });
  const text = full.content[0].text;
  const stop = [...text].slice(3, 5).join("");
  const cut = await client.messages.create({ model: MODEL, max_tokens: 16, temperature: 0, stop_sequences: [stop],
    messages: [{ role: "user", content: LIGHTHOUSE }] });
  assert.equal(cut.stop_reason, "stop_sequence");
  assert.equal(cut.stop_sequence, stop);
  assert.equal(cut.content[0].text, text.slice(0, text.indexOf(stop)));
});

test("errors come as the SDK's typed errors in Anthropic's shape", async () => {
  await assert.rejects(client.messages.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.error.type === "error" &&
      e.error.error.type === "invalid_request_error" && /max_tokens/.test(e.message));
  await assert.rejects(client.messages.create({ model: MODEL, max_tokens: 4, messages: [{ role: "pirate", content: "arr" }] }),
    (e) => e instanceof Anthropic.BadRequestError && /messages\[0\]\.role/.test(e.message));
  await assert.rejects(client.messages.create({ model: MODEL, max_tokens: 4,
    messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "" } }] }] }),
    (e) => e instanceof Anthropic.BadRequestError && /content\[0\]\.type/.test(e.message));
  const raw = await fetch(server.url + "/v1/messages", { method: "GET" });
  assert.equal(raw.status, 405);
  assert.deepEqual(Object.keys(await raw.json()), ["type", "error"]);
});

test("an API key is accepted as x-api-key or Bearer", async () => {
  const guarded = await startServer(binary, ["--api-key", "k-123"]);
  try {
    const wrong = new Anthropic({ baseURL: guarded.url, apiKey: "nope", maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: MODEL, max_tokens: 2, messages: [{ role: "user", content: "hi" }] }),
      (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 && e.error.error.type === "authentication_error");
    for (const c of [new Anthropic({ baseURL: guarded.url, apiKey: "k-123", maxRetries: 0 }),
      new Anthropic({ baseURL: guarded.url, apiKey: null, authToken: "k-123", maxRetries: 0 })]) {
      // greedy: at the API's default temperature of 1 the demo model can sample its end token first
      const m = await c.messages.create({ model: MODEL, max_tokens: 2, temperature: 0,
        messages: [{ role: "user", content: "hi" }] });
      assert.equal(m.usage.output_tokens, 2);
    }
  } finally {
    assert.equal(await guarded.stop(), 0);
  }
});

test("model ids: aliases are listed; --strict-model refuses other ids", async () => {
  const strict = await startServer(binary, ["--model-alias", "deepseek-chat", "--model-alias", "claude-haiku-4-5", "--strict-model"]);
  try {
    const c = new Anthropic({ baseURL: strict.url, apiKey: "x", maxRetries: 0 });
    const ids = [];
    for await (const m of c.models.list()) ids.push(m.id);
    assert.deepEqual(ids, ["tiny-a", "deepseek-chat", "claude-haiku-4-5"]);
    const m = await c.messages.create({ model: "claude-haiku-4-5", max_tokens: 2, messages: [{ role: "user", content: "hi" }] });
    assert.equal(m.model, "tiny-a");
    await assert.rejects(c.messages.create({ model: MODEL, max_tokens: 2, messages: [{ role: "user", content: "hi" }] }),
      (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === "not_found_error");
    await assert.rejects(c.messages.countTokens({ model: MODEL, messages: [{ role: "user", content: "hi" }] }),
      (e) => e instanceof Anthropic.NotFoundError);
  } finally {
    assert.equal(await strict.stop(), 0);
  }
});
