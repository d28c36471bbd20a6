// Clean answers through the official OpenAI and Anthropic Node SDKs against `dsv4 serve` on the
// random-weight tiny-a fixture, streamed and not: a tool call cut by max_tokens comes back as a
// tool call with the arguments written so far (finish_reason "length" / stop_reason
// "max_tokens"), never as DSML markup in the content; and the special tokens the random model
// samples never show in an answer's text.
// The server runs with the test hook DSV4_TEST_UNSTEERED_CONSTRAINTS, so that a forced call
// (the only way a random model writes DSML) is not steered to close within max_tokens (and a
// max_tokens below its minimum is taken): max_tokens cuts it, as it cuts a real model's free call.
// Run: node tests/node/server_clean_answers.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { binaryFromArgs, startServer, FIXTURE } from "./server_harness.mjs";

const binary = binaryFromArgs();
let server;
let client;
let anthropic;

before(async () => {
  server = await startServer(binary, ["--seed", "5"], { DSV4_TEST_UNSTEERED_CONSTRAINTS: "1" });
  client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
  anthropic = new Anthropic({ baseURL: server.url, apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
});

after(async () => {
  assert.equal(await server.stop(), 0, "the server shuts down cleanly on SIGTERM:\n" + server.stderr());
});

// No "strict": the SDK's stream helper would parse strict tools' arguments and refuse a
// "length" finish; the server constrains the call either way (absent strict counts as true).
const WEATHER = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, unit: { enum: ["celsius", "fahrenheit"] } },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};
const NO_MARKUP = /DSML|<｜|invoke|parameter name/;
// Cuts at these fractions of the whole call's tokens: in the city's value, in the unit's
// markup or value (the random model's calls are about 170 tokens long, their name within the
// first 40, their last ~20 the closing markup).
const CUTS = [0.5, 0.62, 0.75, 0.85];

test("OpenAI: a tool call cut by max_tokens is a tool call with the arguments so far, finish_reason length", async () => {
  for (let seed = 1; seed <= 2; ++seed) {
    const base = {
      model: "tiny-a",
      messages: [{ role: "user", content: "What is the weather in Oslo?" }],
      tools: [WEATHER],
      tool_choice: { type: "function", function: { name: "get_weather" } },
      temperature: 1,
      seed,
    };
    // The whole call; without steering to the budget, a smaller max_tokens draws the same
    // tokens and stops early.
    const whole = await client.chat.completions.create({ ...base, max_tokens: 2000 });
    assert.equal(whole.choices[0].finish_reason, "tool_calls");
    const wholeCall = whole.choices[0].message.tool_calls[0].function;
    for (const at of CUTS) {
      const params = { ...base, max_tokens: Math.round(whole.usage.completion_tokens * at) };
      const r = await client.chat.completions.create(params);
      const choice = r.choices[0];
      const where = `seed ${seed}, max_tokens ${params.max_tokens}: ${JSON.stringify(choice.message)}`;
      assert.equal(choice.finish_reason, "length", where);
      assert.ok(!NO_MARKUP.test(choice.message.content ?? ""), where);
      const calls = choice.message.tool_calls;
      assert.equal(calls?.length, 1, where);
      assert.equal(calls[0].type, "function");
      assert.ok(/^call_/.test(calls[0].id));
      // The arguments written so far: a proper prefix of the whole call's (a cut in the middle
      // of a character ends in U+FFFD, as any answer cut there does).
      assert.equal(calls[0].function.name, wholeCall.name, where);
      assert.ok(wholeCall.arguments.startsWith(calls[0].function.arguments.replace(/\uFFFD$/, "")), where);
      assert.ok(calls[0].function.arguments.length < wholeCall.arguments.length, where);
      assert.ok(calls[0].function.arguments.startsWith("{"), where);

      // Streamed: the same call in a tool_calls delta (with its index), the same finish.
      let content = "";
      const streamed = [];
      let finish = null;
      for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
        const c = chunk.choices[0];
        if (!c) continue;
        content += c.delta?.content ?? "";
        for (const t of c.delta?.tool_calls ?? []) streamed.push(t);
        if (c.finish_reason) finish = c.finish_reason;
      }
      assert.equal(finish, "length");
      assert.ok(!NO_MARKUP.test(content), content);
      assert.ok(streamed.every((t) => /^call_/.test(t.id)));
      assert.deepEqual(streamed.map((t) => [t.index, t.function.name, t.function.arguments]),
        calls.map((t, i) => [i, t.function.name, t.function.arguments]));
      // The SDK's stream helper accumulates the same message.
      const final = await client.chat.completions.stream(params).finalChatCompletion();
      assert.equal(final.choices[0].finish_reason, "length");
      assert.deepEqual(final.choices[0].message.tool_calls.map((t) => t.function),
        calls.map((t) => ({ name: t.function.name, arguments: t.function.arguments })));
    }
  }
});

test("Anthropic: a tool_use cut by max_tokens has the input so far, stop_reason max_tokens", async () => {
  const tool = { name: "get_weather", description: "", input_schema: WEATHER.function.parameters };
  for (let day = 1; day <= 2; ++day) {
    const base = {
      model: "claude-sonnet-4-5",
      temperature: 1,
      tools: [tool],
      tool_choice: { type: "tool", name: "get_weather" },
      messages: [{ role: "user", content: `What is the weather in Oslo on day ${day}?` }],
    };
    const whole = await anthropic.messages.create({ ...base, max_tokens: 2000 });
    assert.equal(whole.stop_reason, "tool_use");
    const wholeInput = whole.content.find((b) => b.type === "tool_use").input;
    for (const at of CUTS) {
      const params = { ...base, max_tokens: Math.round(whole.usage.output_tokens * at) };
      const m = await anthropic.messages.create(params);
      const where = `day ${day}, max_tokens ${params.max_tokens}: ${JSON.stringify(m.content)}`;
      assert.equal(m.stop_reason, "max_tokens", where);
      for (const b of m.content) if (b.type === "text") assert.ok(!NO_MARKUP.test(b.text), where);
      const uses = m.content.filter((b) => b.type === "tool_use");
      assert.equal(uses.length, 1, where);
      assert.equal(uses[0].name, "get_weather");
      // The input so far: whole values, and a cut string as far as it went.
      for (const [key, value] of Object.entries(uses[0].input)) {
        if (typeof value === "string") assert.ok(wholeInput[key].startsWith(value.replace(/\uFFFD$/, "")), where);
        else assert.deepEqual(value, wholeInput[key], where);
      }
      // Streamed, the SDK's accumulator rebuilds the same blocks.
      const final = await anthropic.messages.stream(params).finalMessage();
      assert.equal(final.stop_reason, "max_tokens");
      const blocks = (content) => content.map(({ id, ...rest }) => rest);  // ids are per response
      assert.deepEqual(blocks(final.content), blocks(m.content));
    }
  }
});

// The fixture's special tokens (16 of its 512: a random model samples them now and then).
const SPECIALS = JSON.parse(readFileSync(`${FIXTURE}/tokenizer.json`, "utf8")).added_tokens.map((t) => t.content);
const hasSpecial = (text) => SPECIALS.some((s) => text.includes(s));

test("special tokens the model samples never show in the answer's text (both SDKs, streamed and not)", async () => {
  let sampled = 0;  // answers whose log-probabilities show a special token was generated
  for (let seed = 1; seed <= 8; ++seed) {
    const params = { model: "tiny-a", messages: [{ role: "user", content: `Say something, ${seed}.` }], temperature: 1.5,
      seed, max_tokens: 40, logprobs: true, ignore_eos: true };
    const r = await client.chat.completions.create(params);
    const text = r.choices[0].message.content;
    assert.ok(!hasSpecial(text), text);
    if (r.choices[0].logprobs.content.some((t) => SPECIALS.includes(t.token))) ++sampled;
    let streamed = "";
    for await (const chunk of await client.chat.completions.create({ ...params, stream: true }))
      streamed += chunk.choices[0]?.delta?.content ?? "";
    assert.equal(streamed, text);
  }
  assert.ok(sampled >= 2, `only ${sampled} of 8 answers sampled a special token: the test shows nothing`);
  for (let day = 1; day <= 4; ++day) {
    const params = { model: "claude-sonnet-4-5", max_tokens: 40, temperature: 1,
      messages: [{ role: "user", content: `Say something about day ${day}.` }] };
    const m = await anthropic.messages.create(params);
    for (const b of m.content) assert.ok(!hasSpecial(b.text ?? b.thinking ?? ""), JSON.stringify(b));
    const final = await anthropic.messages.stream(params).finalMessage();
    assert.deepEqual(final.content, m.content);
  }
});
