// Memory under a burst of large bodies (issue 21): 40 concurrent 13 MB requests whose bulk is a
// field the API does not read. Admission comes before the body (the queue takes 9, the rest get
// 429 unread), unread fields are skipped, not built, and bodies in flight are bounded: the
// server's peak RSS (from /proc, sampled every 5 ms) stays within 300 MB of its baseline and
// comes back within 10 % of it.
// Run: node tests/node/server_memory.test.mjs build/release/dsv4   (from the repository root)
import { test } from "node:test";
import assert from "node:assert/strict";
import { binaryFromArgs, startServer, rssBytes } from "./server_harness.mjs";

test("40 concurrent 13 MB bodies: bounded peak RSS, back to baseline", async () => {
// One slot, so that one generation runs and the queue's 8 wait (the admission arithmetic above).
const server = await startServer(binaryFromArgs(), ["--max-body-mb", "16", "--parallel", "1"]);
const pid = server.pid();
const chat = (extra) => fetch(server.url + "/v1/chat/completions", { method: "POST", headers: { "Content-Type": "application/json" },
  body: extra ?? JSON.stringify({ model: "tiny-a", messages: [{ role: "user", content: "hi" }], max_tokens: 1 }) });
await (await chat()).text();
await new Promise((r) => setTimeout(r, 500));
const base = rssBytes(pid);
const junk = '{"a":1},'.repeat(Math.floor(13e6 / 8));
const body = Buffer.from('{"model":"tiny-a","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"junk":[' + junk + '0]}');
let peak = base, sampling = true;
(async () => { while (sampling) { peak = Math.max(peak, rssBytes(pid)); await new Promise((r) => setTimeout(r, 5)); } })();
const t0 = Date.now();
const statuses = await Promise.all(Array.from({ length: 40 }, async () => { try { const r = await chat(body); await r.text(); return r.status; } catch (e) { return "err:" + e.cause?.code; } }));
sampling = false;
let after = rssBytes(pid);
for (let i = 0; i < 50 && after > base * 1.1; ++i) { await new Promise((r) => setTimeout(r, 100)); after = rssBytes(pid); }
const count = {}; for (const s of statuses) count[s] = (count[s] ?? 0) + 1;
const report = JSON.stringify({ body_mb: body.length / 1e6, base_mb: base / 1e6, peak_mb: peak / 1e6, after_mb: after / 1e6,
  statuses: count, burst_s: (Date.now() - t0) / 1000 });
console.log("# " + report);
assert.equal(await server.stop(), 0, "clean shutdown:\n" + server.stderr());
assert.equal((count[200] ?? 0) + (count[429] ?? 0), 40, report);
assert.ok(count[200] >= 1 && count[429] >= 1, report);
assert.ok(peak - base < 300e6, "peak RSS within 300 MB of the baseline: " + report);
assert.ok(after <= base * 1.1, "RSS back within 10 % of the baseline: " + report);
});
