// logprobs / top_logprobs through the official OpenAI Node SDK: every returned log-probability
// must equal log-softmax of the engine's own logits for that token, as `dsv4 score` writes them
// (teacher-forced over the prompt and the answer), for completions and chat, streamed or not.
// Run: node tests/node/server_logprobs.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { FIXTURE, binaryFromArgs, startServer, runCli } from "./server_harness.mjs";

const binary = binaryFromArgs();
const VOCAB = JSON.parse(readFileSync(`${FIXTURE}/config.json`, "utf8")).vocab_size;
const TOLERANCE = 1e-5;  // float32 logits, log-softmax in double on both sides
let server;
let client;
let scratch;

before(async () => {
  server = await startServer(binary);
  client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "not-needed", maxRetries: 0, timeout: 120000 });
  scratch = mkdtempSync(join(tmpdir(), "dsv4-logprobs-"));
});

after(async () => {
  rmSync(scratch, { recursive: true, force: true });
  assert.equal(await server.stop(), 0, server.stderr());
});

// log-softmax rows of `dsv4 score` for the positions that predicted each answer token.
function scoredLogprobs(promptIds, answerIds) {
  const ids = [...promptIds, ...answerIds.slice(0, -1)];
  writeFileSync(join(scratch, "ids.txt"), ids.join(","));
  execFileSync(binary, ["score", "-m", FIXTURE, "--numerics", "reference", "--threads", "1", "--tokens-file",
    join(scratch, "ids.txt"), "--logits-out", join(scratch, "logits.f32")], { stdio: ["ignore", "ignore", "pipe"] });
  const bytes = readFileSync(join(scratch, "logits.f32"));
  const logits = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  assert.equal(logits.length, ids.length * VOCAB);
  return answerIds.map((token, i) => {
    const row = logits.subarray((promptIds.length - 1 + i) * VOCAB, (promptIds.length + i) * VOCAB);
    let max = -Infinity;
    for (const l of row) max = Math.max(max, l);
    let sum = 0;
    for (const l of row) sum += Math.exp(l - max);
    const logZ = max + Math.log(sum);
    const all = Array.from(row, (l) => l - logZ);
    const top = all.map((lp, id) => [id, lp]).sort((a, b) => b[1] - a[1] || a[0] - b[0]);
    return { token, logprob: all[token], top };
  });
}

function assertClose(actual, expected, what) {
  assert.ok(Math.abs(actual - expected) <= TOLERANCE, `${what}: ${actual} vs ${expected}`);
}

test("completions: token_logprobs and top_logprobs equal log-softmax of dsv4 score's logits", async () => {
  const cli = runCli(binary, ["--temperature", "0", "--max-tokens", "8", "--raw", "the cat"]);
  const r = await client.completions.create({ model: "tiny-a", prompt: cli.prompt_tokens, max_tokens: 8, temperature: 0, logprobs: 5 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 8);
  const expected = scoredLogprobs(cli.prompt_tokens, cli.tokens);
  let offset = 0;
  for (let i = 0; i < 8; ++i) {
    assertClose(lp.token_logprobs[i], expected[i].logprob, `token ${i}`);
    const top = Object.values(lp.top_logprobs[i]).sort((a, b) => b - a);
    assert.ok(top.length >= 1 && top.length <= 5);
    // Distinct token texts: the dictionary holds the five most likely (equal texts may merge).
    for (let k = 0; k < top.length; ++k) assert.ok(expected[i].top.slice(0, 5).some(([, v]) => Math.abs(v - top[k]) <= TOLERANCE));
    assertClose(top[0], expected[i].top[0][1], `top-1 of token ${i}`);
    assert.equal(lp.text_offset[i], offset);
    offset += lp.tokens[i].startsWith("bytes:") ? (lp.tokens[i].length - 6) / 4 : Buffer.byteLength(lp.tokens[i]);
  }
  // Greedy: the chosen token is the most likely one.
  for (let i = 0; i < 8; ++i) assert.equal(expected[i].top[0][0], cli.tokens[i]);
});

test("chat: logprobs.content per token, with top_logprobs, equal dsv4 score; streaming agrees", async () => {
  const PROMPT = "Tell me about the lighthouse keeper and his cat.";
  const cli = runCli(binary, ["--temperature", "0", "--max-tokens", "10", PROMPT]);
  const body = { model: "tiny-a", messages: [{ role: "user", content: PROMPT }], max_tokens: 10, temperature: 0,
    logprobs: true, top_logprobs: 3 };
  const r = await client.chat.completions.create(body);
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 10);
  const expected = scoredLogprobs(cli.prompt_tokens, cli.tokens);
  for (let i = 0; i < 10; ++i) {
    assertClose(content[i].logprob, expected[i].logprob, `token ${i}`);
    assert.equal(content[i].top_logprobs.length, 3);
    for (let k = 0; k < 3; ++k) assertClose(content[i].top_logprobs[k].logprob, expected[i].top[k][1], `top ${k} of token ${i}`);
    assert.ok(Array.isArray(content[i].bytes));
  }
  // The tokens' bytes are the answer's bytes.
  const bytes = Buffer.from(content.flatMap((c) => c.bytes));
  assert.equal(bytes.toString("utf8"), r.choices[0].message.content);

  let streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const lp = chunk.choices[0]?.logprobs;
    if (lp) streamed = streamed.concat(lp.content);
  }
  assert.deepEqual(streamed, content);

  // Without logprobs there are none; top_logprobs needs logprobs.
  const plain = await client.chat.completions.create({ ...body, logprobs: undefined, top_logprobs: undefined });
  assert.equal(plain.choices[0].logprobs, null);
  await assert.rejects(client.chat.completions.create({ ...body, logprobs: false }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "top_logprobs");
});
