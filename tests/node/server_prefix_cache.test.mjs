// The prefix cache's disk tier across real restarts of `dsv4 serve --cache-dir`: an agent's
// long system prompt sent again after a restart is reported as cached and its time to first
// token drops; a byte flipped in each cache file is detected (one warning per file) and the
// answer stays identical to an uncached run; a server killed with SIGKILL right after writing
// leaves nothing behind that fails to load.
// Run: node tests/node/server_prefix_cache.test.mjs build/release/dsv4   (from the repository root)
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { binaryFromArgs, startServer } from "./server_harness.mjs";

const binary = binaryFromArgs();
// Under the sanitizers prefill is some 25 times slower: shorter prompts keep the test short
// (the load of a snapshot stays far cheaper than the prefill it saves either way).
const sanitized = process.env.ASAN_OPTIONS !== undefined;
const LONG = sanitized ? 12 : 60, SHORT = sanitized ? 6 : 30;
const dir = mkdtempSync(join(tmpdir(), "dsv4-cache-dir-"));
after(() => rmSync(dir, { recursive: true, force: true }));

// An agent-like system prompt (60 lines: about 2,000 tokens): prefilling it dominates the first
// answer's time to first token.
function systemPrompt(seed, lineCount = LONG) {
  const words = ["keeper", "lamp", "harbor", "ledger", "storm", "signal", "tide", "rope", "beacon", "gull"];
  const lines = [];
  for (let i = 0; i < lineCount; ++i)
    lines.push(`Rule ${seed}.${i}: when the ${words[i % 10]} meets the ${words[(i * 7 + seed) % 10]}, log entry ${i * 13 + seed}.`);
  return lines.join("\n");
}
const ask = async (server, system, user = "Which rule covers the storm?") => {
  const r = await fetch(server.url + "/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "tiny-a", temperature: 0, max_tokens: 8,
      messages: [{ role: "system", content: system }, { role: "user", content: user }] }),
  });
  assert.equal(r.status, 200);
  return r.json();
};
const cacheFiles = () => readdirSync(dir).filter((f) => f.endsWith(".dsv4p"));
const start = () => startServer(binary, ["--cache-dir", dir]);

test("restart: the long prefix is cached, TTFT drops; a flipped byte is detected and the answer is unchanged", async (t) => {
  const SYSTEM = systemPrompt(1);
  let server = await start();
  const cold = await ask(server, SYSTEM);
  assert.equal(await server.stop(), 0, server.stderr());
  assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(cold.usage.prompt_tokens > 30 * LONG, `a long prompt: ${cold.usage.prompt_tokens} tokens`);
  assert.ok(cacheFiles().length >= 1, "snapshots were written");
  assert.deepEqual(readdirSync(dir).filter((f) => !f.endsWith(".dsv4p")), [], "no temporary files are left");

  server = await start();
  const warm = await ask(server, SYSTEM);
  assert.equal(await server.stop(), 0, server.stderr());
  assert.equal(warm.choices[0].message.content, cold.choices[0].message.content);
  const cached = warm.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0.9 * warm.usage.prompt_tokens, `cached ${cached} of ${warm.usage.prompt_tokens}`);
  t.diagnostic(`${warm.usage.prompt_tokens} prompt tokens, ${cached} cached after the restart: TTFT ${warm.stats.ttft_s.toFixed(3)} s ` +
    `vs ${cold.stats.ttft_s.toFixed(3)} s uncached`);
  assert.ok(warm.stats.ttft_s < 0.5 * cold.stats.ttft_s,
    `TTFT after the restart ${warm.stats.ttft_s} s vs ${cold.stats.ttft_s} s uncached`);
  assert.doesNotMatch(server.stderr(), /prefix cache:/, "no warnings");

  // Flip one byte in the middle of every cache file.
  const flipped = cacheFiles();
  for (const f of flipped) {
    const bytes = readFileSync(join(dir, f));
    bytes[bytes.length >> 1] ^= 0x40;
    writeFileSync(join(dir, f), bytes);
  }
  server = await start();
  const after1 = await ask(server, SYSTEM);
  const warnings = () => server.stderr().split("\n").filter((l) => /prefix cache: .*checksum mismatch/.test(l));
  const first = warnings().length;
  assert.equal(after1.choices[0].message.content, cold.choices[0].message.content, "the same answer as uncached");
  assert.equal(after1.usage.prompt_tokens_details.cached_tokens, 0, "nothing corrupted was used");
  assert.ok(first >= 1 && first <= flipped.length, server.stderr());
  for (const f of flipped) assert.ok(warnings().filter((l) => l.includes(f)).length <= 1, `one warning for ${f}`);
  // Asked again: served from the fresh snapshots, and no further warning.
  const again = await ask(server, SYSTEM);
  assert.equal(again.choices[0].message.content, cold.choices[0].message.content);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0);
  assert.equal(warnings().length, first);
  assert.equal(await server.stop(), 0, server.stderr());
});

test("kill -9 right after answering leaves no entry that fails to load", async () => {
  for (let round = 0; round < 2; ++round) {
    const SYSTEM = systemPrompt(10 + round, SHORT);
    const server = await start();
    const answered = ask(server, SYSTEM);
    await answered;
    process.kill(server.pid(), "SIGKILL");  // the snapshots are being written about now
    await server.stop();
  }
  const server = await start();
  for (let round = 0; round < 2; ++round) {
    const r = await ask(server, systemPrompt(10 + round, SHORT));
    assert.ok(r.usage.prompt_tokens > 20 * SHORT);
  }
  assert.equal(await server.stop(), 0, server.stderr());
  assert.doesNotMatch(server.stderr(), /prefix cache: .*(mismatch|truncated|garbled|removed)/, server.stderr());
  assert.deepEqual(readdirSync(dir).filter((f) => !f.endsWith(".dsv4p")), [], "temporary files of killed servers are removed");
});
