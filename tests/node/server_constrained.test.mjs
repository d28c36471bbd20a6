// Constrained answers through the official OpenAI and Anthropic Node SDKs against `dsv4 serve`
// on the random-weight tiny-a fixture: response_format json_schema / json_object, and forced
// tool calls (OpenAI tool_choice "required" and a named function, Anthropic "any" and "tool"),
// streaming and not. Whatever the random model prefers, every finished answer parses, and an
// independent validator (Debian's python3-jsonschema via tests/validate_json.py) checks it
// against its schema.
// Run: node tests/node/server_constrained.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { binaryFromArgs, startServer } from "./server_harness.mjs";

const binary = binaryFromArgs();
let server;
let client;
let anthropic;

before(async () => {
  // A fixed default seed: Anthropic's API has no seed, so its requests vary by prompt instead.
  server = await startServer(binary, ["--seed", "5"]);
  client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
  anthropic = new Anthropic({ baseURL: server.url, apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
});

after(async () => {
  assert.equal(await server.stop(), 0, "the server shuts down cleanly on SIGTERM:\n" + server.stderr());
});

// Runs the validator over everything collected so far; fails the test on any invalid output.
function validate(lines, minimum) {
  const dir = mkdtempSync(path.join(tmpdir(), "dsv4-constrained-"));
  try {
    const file = path.join(dir, "outputs.jsonl");
    writeFileSync(file, lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
    const report = execFileSync("/usr/bin/python3", ["tests/validate_json.py", file]).toString();
    console.log(report.trim());
    const m = report.match(/validated (\d+) JSON outputs and (\d+) tool-call arguments/);
    assert.ok(m && Number(m[1]) + Number(m[2]) >= minimum, report);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 10 },
    age: { type: "integer" },
    languages: { type: "array", items: { enum: ["en", "fr", "日本語", "quote\"d"] }, maxItems: 2 },
    pet: { anyOf: [{ type: "null" }, { $ref: "#/$defs/pet" }] },
  },
  required: ["name", "age", "pet"],
  additionalProperties: false,
  $defs: { pet: { type: "object", properties: { kind: { enum: ["cat", "dog"] }, weight: { type: "number" } },
    required: ["kind"], additionalProperties: false } },
};

test("response_format json_schema: every finished answer validates (seeds at temperature 1)", async () => {
  const lines = [];
  for (let seed = 1; seed <= 10; ++seed) {
    const r = await client.chat.completions.create({
      model: "tiny-a",
      messages: [{ role: "user", content: "Describe a person." }],
      response_format: { type: "json_schema", json_schema: { name: "person", schema: PERSON, strict: true } },
      temperature: 1,
      seed,
      max_tokens: 160,
    });
    const choice = r.choices[0];
    assert.ok(["stop", "length"].includes(choice.finish_reason));
    if (choice.finish_reason === "stop") JSON.parse(choice.message.content);  // parses on the first try
    lines.push({ kind: "json", schema: PERSON, text: choice.message.content, finish: choice.finish_reason });
  }
  validate(lines, 5);
});

test("response_format json_object and streaming: the streamed text is the same valid JSON", async () => {
  const body = {
    model: "tiny-a",
    messages: [{ role: "user", content: "Any JSON object, please." }],
    response_format: { type: "json_schema", json_schema: { name: "person", schema: PERSON } },
    temperature: 1,
    seed: 3,
    max_tokens: 160,
  };
  const whole = await client.chat.completions.create(body);
  let text = "";
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true }))
    text += chunk.choices[0]?.delta?.content ?? "";
  assert.equal(text, whole.choices[0].message.content);

  const lines = [];
  for (let seed = 1; seed <= 4; ++seed) {
    const r = await client.chat.completions.create({
      model: "tiny-a",
      messages: [{ role: "user", content: "Any JSON object, please." }],
      response_format: { type: "json_object" },
      temperature: 1,
      seed,
      max_tokens: 200,
    });
    const c = r.choices[0];
    assert.equal(c.message.content[0], "{");
    lines.push({ kind: "json", schema: { type: "object" }, text: c.message.content, finish: c.finish_reason });
  }
  validate(lines, 0);
});

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      strict: true,
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", maxLength: 6 },
          unit: { enum: ["celsius", "fahrenheit"] },
          days: { type: "integer" },
        },
        required: ["city", "unit"],
        additionalProperties: false,
      },
    },
  },
  { type: "function", function: { name: "get_time", strict: true, parameters: { type: "object", properties: {},
    additionalProperties: false } } },
];
const paramsOf = (name) => TOOLS.find((t) => t.function.name === name).function.parameters;

test("tool_choice required and a named function always return tool calls whose arguments validate", async () => {
  const lines = [];
  let finished = 0;
  for (const tool_choice of ["required", { type: "function", function: { name: "get_weather" } }]) {
    for (let seed = 1; seed <= 6; ++seed) {
      const params = {
        model: "tiny-a",
        messages: [{ role: "user", content: "What is the weather in Oslo?" }],
        tools: TOOLS,
        tool_choice,
        temperature: 1,
        seed,
        max_tokens: 240,
      };
      const r = await client.chat.completions.create(params);
      const choice = r.choices[0];
      if (choice.finish_reason === "length") continue;
      ++finished;
      assert.equal(choice.finish_reason, "tool_calls");
      const calls = choice.message.tool_calls;
      assert.ok(calls && calls.length >= 1);
      if (typeof tool_choice === "object") {
        assert.equal(calls.length, 1);
        assert.equal(calls[0].function.name, "get_weather");
      }
      // The SDK's parse helper reads strict tools' arguments as JSON.
      const parsed = await client.chat.completions.parse(params);
      for (const call of parsed.choices[0].message.tool_calls) {
        assert.equal(typeof call.function.parsed_arguments, "object");
        lines.push({ kind: "call", schema: paramsOf(call.function.name), arguments: call.function.arguments });
      }
    }
  }
  assert.ok(finished >= 6, `${finished} of 12 finished`);
  validate(lines, 6);
});

test("a forced call streams as tool_calls deltas the SDK's accumulator reads", async () => {
  const params = {
    model: "tiny-a",
    messages: [{ role: "user", content: "Weather?" }],
    tools: TOOLS,
    tool_choice: { type: "function", function: { name: "get_weather" } },
    temperature: 1,
    seed: 2,
    max_tokens: 240,
  };
  const whole = await client.chat.completions.create(params);
  const runner = client.chat.completions.stream(params);
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, whole.choices[0].finish_reason);
  const calls = (m) => m.tool_calls?.map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
  assert.deepEqual(calls(final.choices[0].message), calls(whole.choices[0].message));
});

// The same tools in Anthropic's shape.
const ANTHROPIC_TOOLS = TOOLS.map(({ function: f }) => ({ name: f.name, description: "", input_schema: f.parameters }));

test("Anthropic tool_choice any and tool always return tool_use blocks whose input validates", async () => {
  const lines = [];
  let finished = 0;
  let streamed = 0;
  const choices = [{ type: "any" }, { type: "tool", name: "get_weather" }, { type: "any", disable_parallel_tool_use: true }];
  for (const tool_choice of choices) {
    for (let day = 1; day <= 4; ++day) {
      const params = {
        model: "claude-sonnet-4-5",
        max_tokens: 240,
        temperature: 1,
        tools: ANTHROPIC_TOOLS,
        tool_choice,
        messages: [{ role: "user", content: `What is the weather in Oslo on day ${day}?` }],
      };
      const m = await anthropic.messages.create(params);
      if (m.stop_reason === "max_tokens") continue;
      ++finished;
      assert.equal(m.stop_reason, "tool_use");
      assert.ok(m.content.length >= 1 && m.content.every((b) => b.type === "tool_use"), JSON.stringify(m.content));
      if (tool_choice.type === "tool" || tool_choice.disable_parallel_tool_use) assert.equal(m.content.length, 1);
      for (const b of m.content) {
        if (tool_choice.type === "tool") assert.equal(b.name, "get_weather");
        assert.equal(typeof b.input, "object");
        lines.push({ kind: "call", schema: paramsOf(b.name), arguments: JSON.stringify(b.input) });
      }
      // Streamed, the SDK's accumulator rebuilds the same blocks from input_json_delta events.
      if (day <= 2) {
        const final = await anthropic.messages.stream(params).finalMessage();
        assert.equal(final.stop_reason, m.stop_reason);
        assert.deepEqual(final.content.map((b) => [b.name, b.input]), m.content.map((b) => [b.name, b.input]));
        ++streamed;
      }
    }
  }
  assert.ok(finished >= 6, `${finished} of 12 finished`);
  assert.ok(streamed >= 2);
  validate(lines, 6);

  // "none" never answers with a tool call; a schema outside the subset is a 400 naming the keyword.
  for (let day = 1; day <= 3; ++day) {
    const m = await anthropic.messages.create({ model: "claude-sonnet-4-5", max_tokens: 24, temperature: 1,
      tools: ANTHROPIC_TOOLS, tool_choice: { type: "none" }, messages: [{ role: "user", content: `Weather, day ${day}?` }] });
    assert.notEqual(m.stop_reason, "tool_use");
    assert.ok(m.content.every((b) => b.type !== "tool_use"));
  }
  await assert.rejects(
    anthropic.messages.create({ model: "claude-sonnet-4-5", max_tokens: 24, tool_choice: { type: "any" },
      tools: [{ name: "f", input_schema: { type: "object", properties: { n: { type: "array", unevaluatedItems: false } } } }],
      messages: [{ role: "user", content: "hi" }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.type === "error" &&
      /tools\[0\]\.input_schema\.properties\.n\.unevaluatedItems/.test(e.message));
});

test("max_tokens below the schema's shortest answer is a 400 naming it; at that minimum the answer is complete", async () => {
  const params = {
    model: "tiny-a",
    messages: [{ role: "user", content: "Describe a person." }],
    response_format: { type: "json_schema", json_schema: { name: "person", schema: PERSON, strict: true } },
    temperature: 1,
    seed: 1,
    max_tokens: 4,
  };
  let minimum = 0;
  await assert.rejects(client.chat.completions.create(params), (e) => {
    const m = /shortest complete answer .* takes (\d+) tokens/.exec(e.message);
    if (!(e instanceof OpenAI.BadRequestError) || e.param !== "max_tokens" || !m) return false;
    minimum = Number(m[1]);
    return minimum > 4;
  });
  // Exactly the minimum: the mask steers to the end, so the answer is whole and the SDK parses it.
  const r = await client.chat.completions.parse({ ...params, max_tokens: minimum });
  assert.equal(r.choices[0].finish_reason, "stop");
  const person = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(r.choices[0].message.parsed, person);
  for (const key of PERSON.required ?? []) assert.ok(key in person, `${key} missing in ${r.choices[0].message.content}`);
});

test("schemas outside the subset are 400s naming the keyword's path", async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: "tiny-a",
      messages: [{ role: "user", content: "hi" }],
      response_format: { type: "json_schema", json_schema: { name: "x", schema: {
        type: "object", properties: { when: { type: "string", pattern: "\\bword" } } } } },
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "response_format.json_schema.schema.properties.when.pattern" &&
      /word boundary/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({
      model: "tiny-a",
      messages: [{ role: "user", content: "hi" }],
      tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {
        n: { type: "integer", multipleOf: 0.5 } } } } }],
      tool_choice: "required",
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "tools[0].function.parameters.properties.n.multipleOf");
  // A hostile schema (a $ref cycle) is refused at once, and the server keeps serving.
  await assert.rejects(
    client.chat.completions.create({
      model: "tiny-a",
      messages: [{ role: "user", content: "hi" }],
      response_format: { type: "json_schema", json_schema: { name: "x", schema: {
        $defs: { a: { anyOf: [{ $ref: "#/$defs/b" }] }, b: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" } } },
    }),
    (e) => e instanceof OpenAI.BadRequestError && /\$ref/.test(e.param));
  const ok = await client.chat.completions.create({ model: "tiny-a", messages: [{ role: "user", content: "hi" }], max_tokens: 2,
    temperature: 0 });  // greedy: sampled, the end token can come first
  assert.equal(ok.usage.completion_tokens, 2);
});
