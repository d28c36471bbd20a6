// Load: 32 concurrent clients against a server with a small queue (--max-queue 3). Every
// accepted request must finish with exactly the sequential greedy answer, the others must get
// 429 with Retry-After, the server must not crash, and its resident memory must stay flat
// over repeated rounds.
// Run: node tests/node/server_load.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { binaryFromArgs, startServer, rssBytes } from "./server_harness.mjs";

const binary = binaryFromArgs();
const CLIENTS = 32;
const QUEUE = 3;
const ROUNDS = 3;
const PROMPT = "Tell me about the lighthouse keeper and his cat.";
// Under AddressSanitizer freed memory waits in a quarantine before reuse (256 MB by default);
// bound it so that the RSS check measures the server, not the sanitizer. The option is harmless
// to a build without ASan, and whether the server has ASan is read from its own mappings (not
// guessed from the environment: `ctest` in build/asan runs without ASAN_OPTIONS).
process.env.ASAN_OPTIONS = [process.env.ASAN_OPTIONS, "quarantine_size_mb=16"].filter(Boolean).join(":");
const hasAsan = (pid) => readFileSync(`/proc/${pid}/maps`, "utf8").includes("libasan");

let server;
let expected;

const chat = (extra = {}) => fetch(server.url + "/v1/chat/completions", {
  method: "POST",
  headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model: "tiny-a", messages: [{ role: "user", content: PROMPT }], temperature: 0, max_tokens: 16, ...extra }),
  signal: extra.signal,
});
const health = async () => (await fetch(server.url + "/health")).json();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function outcome(response) {
  const body = await response.json();
  return { status: response.status, retryAfter: response.headers.get("retry-after"), body };
}

function checkOutcomes(outcomes) {
  let accepted = 0;
  for (const o of outcomes) {
    if (o.status === 200) {
      ++accepted;
      assert.equal(o.body.choices[0].message.content, expected, "an accepted request has the sequential greedy answer");
      assert.equal(o.body.usage.completion_tokens, 16);
    } else {
      assert.equal(o.status, 429, JSON.stringify(o.body));
      assert.equal(o.body.error.code, "queue_full");
      assert.ok(Number(o.retryAfter) >= 1, `Retry-After: ${o.retryAfter}`);
    }
  }
  return accepted;
}

// With a generation holding the engine, exactly QUEUE of the clients can wait; all others are
// refused at once. Then the blocking generation is cancelled and the waiting ones finish.
async function blockedRound() {
  const blocker = new AbortController();
  const stream = await chat({ stream: true, ignore_eos: true, max_tokens: 1000000, signal: blocker.signal });
  const reader = stream.body.getReader();
  await reader.read();  // the stream has started; the worker may not have picked it up yet
  // The first chunk can be sent while the blocker still waits in the queue for the worker
  // thread, so wait until the engine is really running it.
  const started = Date.now() + 30000;
  for (let h = await health(); !(h.running && h.queue_depth === 0); h = await health()) {
    assert.ok(Date.now() < started, `the blocker never started: ${JSON.stringify(h)}`);
    await sleep(5);
  }

  let settled = 0;
  const requests = Array.from({ length: CLIENTS }, () => chat().then(outcome).finally(() => ++settled));
  const deadline = Date.now() + 60000;
  while (settled < CLIENTS - QUEUE) {
    assert.ok(Date.now() < deadline, `only ${settled} clients were answered`);
    await sleep(10);
  }
  assert.equal((await health()).queue_depth, QUEUE);
  await sleep(100);
  assert.equal(settled, CLIENTS - QUEUE, "the waiting requests do not finish while the engine is held");
  blocker.abort();
  const outcomes = await Promise.all(requests);
  assert.equal(checkOutcomes(outcomes), QUEUE);
}

// Until no request runs or waits. A client has its answer before the worker that sent it frees
// its slot (the worker first hands the request's snapshots to the prefix cache), so the round
// before may still hold the one slot for a while after its last answer arrived.
async function idle() {
  const deadline = Date.now() + 30000;
  for (let h = await health(); h.running || h.queue_depth > 0; h = await health()) {
    assert.ok(Date.now() < deadline, `the server never went idle: ${JSON.stringify(h)}`);
    await sleep(5);
  }
}

// No blocker, from an idle server: whoever finds room is served (at least the slot and the
// queue's QUEUE places), the rest refused, in whatever proportion.
async function freeRound() {
  await idle();
  const outcomes = await Promise.all(Array.from({ length: CLIENTS }, () => chat().then(outcome)));
  const accepted = checkOutcomes(outcomes);
  console.log(`# free round: ${accepted} accepted, ${CLIENTS - accepted} refused with 429`);
  assert.ok(accepted >= QUEUE + 1);
}

before(async () => {
  // One slot: the blocker holds the engine (tests/server_batch_test.cc covers --parallel slots).
  server = await startServer(binary, ["--max-queue", String(QUEUE), "--parallel", "1"]);
  const r = await (await chat()).json();
  expected = r.choices[0].message.content;
  assert.equal(r.usage.completion_tokens, 16);
});

after(async () => {
  assert.equal(await server.stop(), 0, "the server shuts down cleanly:\n" + server.stderr().slice(-4000));
});

test(`${CLIENTS} concurrent clients, queue of ${QUEUE}: accepted ones are correct, the rest get 429, RSS stays flat`, async () => {
  await blockedRound();  // warm-up: allocator pools, prefix cache, HTTP threads
  await freeRound();
  const pid = server.pid();
  const rssGrowthLimit = (hasAsan(pid) ? 64 : 8) * 1024 * 1024;
  const before = rssBytes(pid);
  for (let i = 0; i < ROUNDS; ++i) {
    await blockedRound();
    await freeRound();
  }
  const after = rssBytes(pid);
  console.log(`# VmRSS before ${(before / 1048576).toFixed(1)} MiB, after ${ROUNDS} more rounds ${(after / 1048576).toFixed(1)} MiB (limit +${rssGrowthLimit / 1048576} MiB)`);
  assert.ok(after - before < rssGrowthLimit, `RSS grew by ${((after - before) / 1048576).toFixed(1)} MiB`);
  const h = await health();
  assert.equal(h.status, "ok");
  assert.equal(h.queue_depth, 0);
  const metrics = await (await fetch(server.url + "/metrics")).text();
  const rejected = Number(metrics.match(/^dsv4_rejected_requests_total (\d+)$/m)[1]);
  assert.ok(rejected >= (ROUNDS + 1) * (CLIENTS - QUEUE), `${rejected} rejections counted`);
});
