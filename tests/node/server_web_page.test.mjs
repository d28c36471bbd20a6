// The web chat page in headless Chromium (Debian's chromium driven by playwright-core): type,
// send, watch the answer stream in, stop one mid-way (the server must cancel it), thinking in a
// collapsible block, and stats per answer; a message that was not sent (invalid setting, missing
// or wrong API key, an error JSON, the server down) says why and stays in the input.
// Run: node tests/node/server_web_page.test.mjs build/release/dsv4   (from the repository root)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { binaryFromArgs, startServer } from "./server_harness.mjs";

const CHROMIUM = "/usr/bin/chromium";
const binary = binaryFromArgs();
if (!existsSync(CHROMIUM)) {
  console.log(`# SKIP: ${CHROMIUM} is not installed (scripts/setup.sh installs it unless DSV4_SETUP_BROWSER=0)`);
  process.exit(77);
}
const { chromium } = await import("playwright-core");

let server;
let browser;
let profile;
let page;

before(async () => {
  // 15 ms per token: the tiny model would otherwise finish before the page has drawn a frame.
  server = await startServer(binary, [], { DSV4_TEST_TOKEN_DELAY_MS: "15" });
  profile = mkdtempSync(join(tmpdir(), "dsv4-chromium-"));
  // A fresh profile directory per run (playwright passes it as --user-data-dir).
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run"],
  });
  page = browser.pages()[0] ?? await browser.newPage();
  page.on("pageerror", (e) => assert.fail("page error: " + e.message));
  await page.goto(server.url + "/");
  await page.waitForFunction(() => document.getElementById("model").textContent === "tiny-a");
});

after(async () => {
  await browser?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
  assert.equal(await server.stop(), 0, "the server shuts down cleanly:\n" + server.stderr());
});

async function setSettings({ temperature, maxTokens, think }) {
  await page.click("#settings-toggle");
  await page.fill("#temperature", String(temperature));
  await page.fill("#max-tokens", String(maxTokens));
  await page.click("#settings-toggle");
  await page.setChecked("#think", think);
}

// Records every change of the last assistant message's text (to see it stream).
async function watchLastAnswer() {
  await page.evaluate(() => {
    window.__lengths = [];
    const observer = new MutationObserver(() => {
      const answers = document.querySelectorAll(".msg.assistant");
      const last = answers[answers.length - 1];
      if (!last) return;
      const n = last.querySelector(".bubble").textContent.length + last.querySelector(".reasoning").textContent.length;
      if (n !== window.__lengths.at(-1)) window.__lengths.push(n);
    });
    observer.observe(document.getElementById("conversation"), { childList: true, subtree: true, characterData: true });
  });
}

async function sendMessage(text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
}

const lastAnswer = () => page.locator(".msg.assistant").last();
const health = async () => (await fetch(server.url + "/health")).json();

test("type, send, and see the answer stream in, with stats", async () => {
  await setSettings({ temperature: 0, maxTokens: 24, think: false });
  await watchLastAnswer();
  await sendMessage("Tell me about the lighthouse keeper and his cat.");
  await page.waitForSelector(".msg.assistant:not(.streaming) .stats:not(:empty)", { timeout: 60000 });
  const lengths = await page.evaluate(() => window.__lengths);
  assert.ok(lengths.filter((n) => n > 0).length > 2, `the text arrived in pieces: ${lengths}`);
  const shown = await lastAnswer().locator(".bubble").textContent();

  // The page shows exactly what the API answers for the same conversation.
  const api = await (await fetch(server.url + "/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "tiny-a", messages: [{ role: "user", content: "Tell me about the lighthouse keeper and his cat." }],
      temperature: 0, max_tokens: 24 }),
  })).json();
  assert.equal(shown, api.choices[0].message.content);
  const stats = await lastAnswer().locator(".stats").textContent();
  assert.match(stats, /TTFT \d+\.\d\d s · \d+\.\d tok\/s · 24 tokens/);
  assert.equal(await page.isVisible("#send"), true);
  assert.equal(await page.isVisible("#stop"), false);
});

test("a follow-up turn reuses the conversation's cached prompt", async () => {
  await sendMessage("And the dog?");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant:not(.streaming) .stats:not(:empty)").length === 2,
    null, { timeout: 60000 });
  assert.match(await lastAnswer().locator(".stats").textContent(), /\d+ prompt tokens cached/);
  assert.equal(await page.locator(".msg.user").count(), 2);
});

test("stop ends a long answer and the server cancels it", async () => {
  await page.click("#new-chat");
  assert.equal(await page.locator(".msg").count(), 0);
  await setSettings({ temperature: 0, maxTokens: 100000, think: false });
  await watchLastAnswer();
  await sendMessage("blocker");  // greedy on tiny-a: a long answer before the end-of-sentence token
  await page.waitForFunction(() => window.__lengths.length > 3, null, { timeout: 60000 });
  assert.equal((await health()).running, true);
  await page.click("#stop");
  const clicked = Date.now();
  while ((await health()).running) {
    assert.ok(Date.now() - clicked < 1000, "the server still generates 1 s after Stop");
    await new Promise((r) => setTimeout(r, 20));
  }
  await page.waitForSelector("#send:visible");
  assert.match(await lastAnswer().locator(".stats").textContent(), /stopped/);
  const after = await lastAnswer().locator(".bubble").textContent();
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await lastAnswer().locator(".bubble").textContent(), after, "no text after Stop");
});

test("thinking mode shows the reasoning in a collapsible block", async () => {
  await page.click("#new-chat");
  await setSettings({ temperature: 0, maxTokens: 12, think: true });
  await sendMessage("Think about lighthouses.");
  await page.waitForSelector(".msg.assistant:not(.streaming) .stats:not(:empty)", { timeout: 60000 });
  const block = lastAnswer().locator("details.thinking");
  assert.equal(await block.isVisible(), true);
  assert.ok((await block.locator(".reasoning").textContent()).length > 0);
  // Collapsible: the summary toggles it.
  const open = await block.evaluate((d) => d.open);
  await block.locator("summary").click();
  assert.equal(await block.evaluate((d) => d.open), !open);
  await page.setChecked("#think", false);
});

// The chat requests the page posts, with their JSON bodies.
function recordPosts(p) {
  const posts = [];
  p.on("request", (r) => {
    if (r.method() === "POST" && r.url().endsWith("/v1/chat/completions")) posts.push(r.postDataJSON());
  });
  return posts;
}

// Waits for the "Not sent" notice to be visible and to match `pattern`; returns its text.
async function notice(p, pattern) {
  await p.waitForFunction((src) => {
    const n = document.getElementById("notice");
    return !n.hidden && n.offsetParent !== null && new RegExp(src).test(n.textContent);
  }, pattern.source, { timeout: 10000 });
  return p.locator("#notice").textContent();
}

test("settings out of range are marked invalid and block the send; nothing is clamped", async () => {
  await page.click("#new-chat");
  const posts = recordPosts(page);
  await page.click("#settings-toggle");
  for (const [field, value, message] of [
    ["#temperature", "5", /^Temperature must be a number from 0 to 2, not 5\.$/],
    ["#temperature", "", /^Temperature must be a number from 0 to 2\.$/],
    ["#max-tokens", "-3", /^Max tokens must be a whole number of at least 1, not -3\.$/],
    ["#max-tokens", "2.5", /^Max tokens must be a whole number of at least 1, not 2\.5\.$/],
  ]) {
    await page.fill(field, value);
    assert.equal(await page.getAttribute(field, "aria-invalid"), "true", `${field} = '${value}' is marked invalid`);
    assert.equal(await page.isVisible(`${field}-error`), true);
    assert.match(await page.textContent(`${field}-error`), message);
  }
  await page.click("#settings-toggle");  // closed: Send opens it again to show what is wrong
  await sendMessage("Keep this text.");
  assert.match(await notice(page, /Not sent: Temperature/), /^Not sent: Temperature must be .*\. Max tokens must be .*, not 2\.5\.$/);
  assert.equal(await page.isVisible("#settings"), true);
  assert.equal(await page.inputValue("#input"), "Keep this text.");
  assert.equal(await page.locator(".msg").count(), 0);
  assert.equal(posts.length, 0, "nothing was posted");

  // Fixed: the values go out exactly as typed, and the message leaves the input.
  await page.fill("#temperature", "0.3");
  await page.fill("#max-tokens", "3");
  assert.equal(await page.getAttribute("#temperature", "aria-invalid"), "false");
  assert.equal(await page.isVisible("#max-tokens-error"), false);
  await page.click("#settings-toggle");
  await page.press("#input", "Enter");
  await page.waitForSelector(".msg.assistant:not(.streaming) .stats:not(:empty)", { timeout: 60000 });
  assert.equal(posts.length, 1);
  assert.equal(posts[0].temperature, 0.3);
  assert.equal(posts[0].max_tokens, 3);
  assert.equal(await page.inputValue("#input"), "");
  assert.equal(await page.isVisible("#notice"), false);
  assert.equal(await page.locator(".msg.user .bubble").textContent(), "Keep this text.");
});

test("missing key, wrong key, an error JSON and the server down each say why and keep the message", async () => {
  const keyed = await startServer(binary, ["--api-key", "k3y"]);
  const p = await browser.newPage();  // another port: another origin, its own stored settings
  try {
    p.on("pageerror", (e) => assert.fail("page error: " + e.message));
    const posts = recordPosts(p);
    await p.goto(keyed.url + "/");
    await p.waitForFunction(() => document.getElementById("model").textContent === "API key needed (Settings)");

    const typed = "A message\nwith two lines.";
    await p.fill("#input", typed);
    await p.press("#input", "Enter");
    assert.equal(await notice(p, /API key/), "Not sent: this server needs an API key: enter it in Settings.");
    assert.equal(await p.inputValue("#input"), typed);
    assert.equal(await p.locator(".msg").count(), 0);

    // A wrong key: the server's own error JSON is shown.
    await p.click("#settings-toggle");
    await p.fill("#api-key", "wrong");
    await p.press("#input", "Enter");
    assert.equal(await notice(p, /Incorrect/), "Not sent: Incorrect API key provided. (HTTP 401)");
    assert.equal(await p.inputValue("#input"), typed);

    // An error JSON from the chat endpoint: max_tokens above the server's limit (the page does
    // not know that limit; the server names the field).
    await p.fill("#api-key", "k3y");
    await p.fill("#max-tokens", "99999999999");
    await p.fill("#temperature", "0");
    await p.press("#input", "Enter");
    assert.match(await notice(p, /max_tokens/), /^Not sent: .*max_tokens.* must be at most \d+, got 99999999999\. \(HTTP 400\)$/);
    assert.equal(await p.inputValue("#input"), typed);
    assert.equal(await p.locator(".msg").count(), 0);
    assert.equal(posts.length, 1);

    // The right key: sent, answered, and the input is empty again.
    await p.fill("#max-tokens", "4");
    await p.press("#input", "Enter");
    await p.waitForSelector(".msg.assistant:not(.streaming) .stats:not(:empty)", { timeout: 60000 });
    assert.equal(await p.inputValue("#input"), "");
    assert.equal(await p.isVisible("#notice"), false);

    // The server goes away: the next message is not lost.
    assert.equal(await keyed.stop(), 0, "the keyed server shuts down cleanly:\n" + keyed.stderr());
    await p.fill("#input", "Are you there?");
    await p.press("#input", "Enter");
    assert.match(await notice(p, /unreachable/), /^Not sent: the server is unreachable \(.+\)\.$/);
    assert.equal(await p.inputValue("#input"), "Are you there?");
    assert.equal(await p.locator(".msg.user").count(), 1, "only the message that was answered is in the conversation");
    assert.equal(await p.isVisible("#send"), true);
  } finally {
    await p.close();
    await keyed.stop();
  }
});
