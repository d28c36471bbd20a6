// The agent-trace benchmark of the prefix cache (issue 46 item 5): replays one realistic agent
// session against `dsv4 serve` and reports the tokens it prefilled against the ideal, the
// tokens no earlier request had shown it, with TTFT per request and the cache's RAM and disk.
//
//   node scripts/agent_trace.mjs --dsv4 build/release/dsv4 [--model models/demo] [--json]
//        [-- extra serve flags, e.g. --ram 2G --cache-dir-mb 256]
//
// The session (deterministic): a system prompt with a tool list of about 6k tokens, a document
// of about 3k tokens to read, a retry of that request, the conversation carried on with the
// model's own answers, an assistant turn with two parallel tool calls and their results, a
// fork back at the first turn with another question, two sub-agents at once on the same
// system prompt, n = 2 samples, and a retry after a server restart (the disk tier). Then issue
// 46's acceptance cases: a ~1k-token single-turn prompt sent twice and once more after the
// restart, and a ~4k-token document asked two questions.
//
// The ideal counts, for each request, the tokens of its prompt past the longest common prefix
// with any earlier request's prompt followed by its answer (prompts as `dsv4 tokenize --chat`
// encodes them, answers as their text encodes), and at least one token: a session must feed
// one to give the first logits. Prefilled is prompt_tokens - cached_tokens as the server
// reports them (usage.prompt_tokens_details.cached_tokens).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const argv = process.argv.slice(2);
const sep = argv.indexOf("--");
const own = sep < 0 ? argv : argv.slice(0, sep);
const serveExtra = sep < 0 ? [] : argv.slice(sep + 1);
const opt = (name, fallback) => {
  const i = own.indexOf(name);
  return i < 0 ? fallback : own[i + 1];
};
const binary = opt("--dsv4", "build/release/dsv4");
const model = opt("--model", "models/demo");
const asJson = own.includes("--json");
const cacheDir = mkdtempSync(join(tmpdir(), "dsv4-agent-trace-"));
const children = new Set();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(cacheDir, { recursive: true, force: true });
});

async function startServer() {
  const args = ["serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "--cache-dir", cacheDir, ...serveExtra];
  const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  let stdout = "", stderr = "";
  child.stderr.on("data", (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.on("exit", (code) => { children.delete(child); resolve(code); }));
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("dsv4 serve did not start in 120 s:\n" + stderr)), 120000);
    child.stdout.on("data", (d) => {
      stdout += d;
      const m = stdout.match(/listening on (http:\/\/127\.0\.0\.1:\d+)\//);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    exited.then((code) => reject(new Error(`dsv4 serve exited (${code}) before listening:\n${stderr}`)));
  });
  return {
    url,
    banner: stdout.trim(),
    stderr: () => stderr,
    peakRss: () => Number(readFileSync(`/proc/${child.pid}/status`, "utf8").match(/VmHWM:\s+(\d+) kB/)[1]) * 1024,
    async stop() { child.kill("SIGTERM"); return exited; },
  };
}

// ---- the session ----------------------------------------------------------------------------
function rng(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}
const WORDS = ("keeper lamp harbor ledger storm signal tide rope beacon gull anchor chart compass deck " +
  "hull mast sail rudder keel pier wharf buoy current reef shoal fog bell watch logbook oil wick lens " +
  "gallery cliff shore wave swell gale north south east west morning evening supply boat crew").split(" ");
function prose(rand, sentences) {
  const out = [];
  for (let i = 0; i < sentences; ++i) {
    const n = 8 + Math.floor(rand() * 10);
    const w = [];
    for (let k = 0; k < n; ++k) w.push(WORDS[Math.floor(rand() * WORDS.length)]);
    w[0] = w[0][0].toUpperCase() + w[0].slice(1);
    out.push(w.join(" ") + ".");
  }
  return out.join(" ");
}
const rand = rng(46);
const TOOLS = [];
for (let t = 0; t < 8; ++t) {
  const props = {};
  for (let p = 0; p < 5; ++p)
    props[`${WORDS[(t * 5 + p) % WORDS.length]}_${p}`] = { type: p % 2 ? "integer" : "string", description: prose(rand, 1) };
  TOOLS.push({ type: "function", function: { name: `tool_${WORDS[t]}`, description: prose(rand, 3),
    parameters: { type: "object", properties: props, required: Object.keys(props).slice(0, 2) } } });
}
const SYSTEM = "You are the harbor agent. Follow these rules.\n" +
  Array.from({ length: 32 }, (_, i) => `Rule ${i + 1}: ${prose(rand, 2)}`).join("\n");
const DOC = Array.from({ length: 24 }, (_, i) => `Section ${i + 1}. ${prose(rand, 5)}`).join("\n\n");
const SHORT_PROMPT = "Summarize these notes.\n\n" + Array.from({ length: 10 }, (_, i) => `Note ${i + 1}. ${prose(rand, 4)}`).join("\n");
const LONG_DOC = Array.from({ length: 32 }, (_, i) => `Chapter ${i + 1}. ${prose(rand, 5)}`).join("\n\n");
const system = { role: "system", content: SYSTEM };
const user = (content) => ({ role: "user", content });
const assistant = (content) => ({ role: "assistant", content });
const body = (messages, extra = {}) => ({ model: "m", messages, tools: TOOLS, max_tokens: 12, temperature: 0, ...extra });

// ---- replay ---------------------------------------------------------------------------------
const log = [];  // { label, request, answers, usage, ttft }
async function send(server, label, request) {
  const t0 = performance.now();
  const r = await fetch(server.url + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(request) });
  const j = await r.json();
  if (r.status !== 200) throw new Error(`${label}: ${r.status} ${JSON.stringify(j)}`);
  const entry = { label, request, answers: j.choices.map((c) => c.message.content ?? ""), usage: j.usage,
    ttft: j.stats?.ttft_s ?? (performance.now() - t0) / 1000 };
  log.push(entry);
  return entry;
}

let server = await startServer();
const banner = server.banner;
const turn1 = [system, user("Read this document and summarize it.\n\n" + DOC)];
const a1 = await send(server, "read the document", body(turn1));
await send(server, "retry of it", body(turn1));
const turn2 = [...turn1, assistant(a1.answers[0]), user("Which sections mention the harbor?")];
const a2 = await send(server, "next turn", body(turn2));
const turn3 = [...turn2, assistant(a2.answers[0]), user("Look up the tide and the weather for section 3.")];
const a3 = await send(server, "next turn", body(turn3));
const calls = [
  { id: "call_1", type: "function", function: { name: "tool_keeper", arguments: JSON.stringify({ keeper_0: "tide", lamp_1: 3 }) } },
  { id: "call_2", type: "function", function: { name: "tool_lamp", arguments: JSON.stringify({ chart_0: "weather", compass_1: 3 }) } },
];
const turn4 = [...turn3, { role: "assistant", content: a3.answers[0], tool_calls: calls },
  { role: "tool", tool_call_id: "call_1", content: "High tide at 06:12, low at 12:30." },
  { role: "tool", tool_call_id: "call_2", content: "Fog until noon, then a westerly gale." }];
await send(server, "two tool results", body(turn4));
const fork = [system, user("Read this document and summarize it.\n\n" + DOC), assistant(a1.answers[0]),
  user("List every section that mentions fog.")];
await send(server, "fork at turn 1", body(fork));
await Promise.all([
  send(server, "sub-agent 1", body([system, user("Task 1: draft the supply boat schedule.")])),
  send(server, "sub-agent 2", body([system, user("Task 2: check the lens and the wick.")])),
]);
await send(server, "n = 2 samples", body([...turn2, assistant(a2.answers[0]), user("Suggest a title.")],
  { n: 2, temperature: 0.8, seed: 5 }));
// Acceptance: the same single-turn prompt twice (and after the restart, below); one document,
// two questions (no system prompt, no tools: nothing else is shared).
const plain = (content) => ({ model: "m", messages: [user(content)], max_tokens: 12, temperature: 0 });
await send(server, "1k prompt", plain(SHORT_PROMPT));
await send(server, "1k prompt again", plain(SHORT_PROMPT));
await send(server, "4k document, question 1", plain(LONG_DOC + "\n\nWhich chapter mentions the reef?"));
await send(server, "4k document, question 2", plain(LONG_DOC + "\n\nHow many chapters mention fog?"));
const peakRss = server.peakRss();
const metrics = await (await fetch(server.url + "/metrics")).text();
const ramBytes = Number(metrics.match(/^dsv4_prefix_cache_bytes (\d+)/m)?.[1] ?? NaN);
const stderr1 = server.stderr();
await server.stop();
server = await startServer();
await send(server, "retry after a restart", body(fork));
await send(server, "1k prompt after the restart", plain(SHORT_PROMPT));
const stderr2 = server.stderr();
await server.stop();
const diskBytes = readdirSync(cacheDir).reduce((n, f) => n + statSync(join(cacheDir, f)).size, 0);

// ---- the ideal --------------------------------------------------------------------------------
const tokenizer = join(model, "tokenizer.json");
const promptIds = execFileSync(binary, ["tokenize", "--chat", "-t", tokenizer],
  { input: log.map((e) => JSON.stringify(e.request)).join("\n") + "\n", maxBuffer: 1 << 28 })
  .toString().trim().split("\n").map((l) => JSON.parse(l));
const answerTexts = log.flatMap((e) => e.answers);
const answerIds = execFileSync(binary, ["tokenize", "--jsonl", "-t", tokenizer],
  { input: answerTexts.map((a) => JSON.stringify(a)).join("\n") + "\n", maxBuffer: 1 << 28 })
  .toString().trim().split("\n").map((l) => JSON.parse(l));
const lcp = (a, b) => { let i = 0; while (i < a.length && i < b.length && a[i] === b[i]) ++i; return i; };
const seen = [];
let answerAt = 0;
const rows = log.map((e, i) => {
  const p = promptIds[i];
  const shared = seen.reduce((m, s) => Math.max(m, lcp(p, s)), 0);
  const ideal = Math.max(1, p.length - shared);
  for (let k = 0; k < e.answers.length; ++k) seen.push([...p, ...answerIds[answerAt++]]);
  const cached = e.usage.prompt_tokens_details?.cached_tokens ?? 0;
  if (e.usage.prompt_tokens !== p.length)
    console.error(`note: ${e.label}: the server counted ${e.usage.prompt_tokens} prompt tokens, tokenize --chat ${p.length}`);
  return { label: e.label, prompt: e.usage.prompt_tokens, cached, prefilled: e.usage.prompt_tokens - cached, ideal, ttft_s: e.ttft };
});
const prefilled = rows.reduce((n, r) => n + r.prefilled, 0), ideal = rows.reduce((n, r) => n + r.ideal, 0);
const warnings = (stderr1 + stderr2).split("\n").filter((l) => /prefix cache:/.test(l));
// The planner's line: "... (prefix cache 1.00 GiB), projected peak 1.10 GiB".
const plan = stderr1.match(/ram plan: .*/)?.[0] ?? "";
const gib = (m) => (m ? Number(m[1]) * 2 ** { K: 10, M: 20, G: 30 }[m[2]] : NaN);
const plannedPeak = gib(plan.match(/projected peak ([\d.]+) ([KMG])iB/));
const cacheBound = gib(plan.match(/prefix cache ([\d.]+) ([KMG])iB/));
const report = { banner, plan, requests: rows, prefilled, ideal, ratio: prefilled / ideal, cache_ram_bytes: ramBytes,
  cache_ram_bound_bytes: cacheBound, cache_disk_bytes: diskBytes, peak_rss_bytes: peakRss, planned_peak_bytes: plannedPeak,
  warnings };
if (asJson) {
  console.log(JSON.stringify(report, null, 1));
} else {
  console.log(banner);
  console.log("| request | prompt | cached | prefilled | ideal | TTFT s |\n|---|---:|---:|---:|---:|---:|");
  for (const r of rows) console.log(`| ${r.label} | ${r.prompt} | ${r.cached} | ${r.prefilled} | ${r.ideal} | ${r.ttft_s.toFixed(3)} |`);
  console.log(`prefilled ${prefilled} tokens, ideal ${ideal}: ${(prefilled / ideal).toFixed(3)}x the ideal`);
  const mib = (b) => (b / 2 ** 20).toFixed(1);
  console.log(`prefix cache: ${mib(ramBytes)} MiB in RAM (bound ${mib(cacheBound)} MiB), ${mib(diskBytes)} MiB on disk; ` +
    `server peak RSS ${mib(peakRss)} MiB (planned peak ${mib(plannedPeak)} MiB)`);
  for (const w of warnings) console.log("warning: " + w);
}
