// The web chat page in headless Chromium (Debian's chromium driven by playwright-core): type,
// send, watch the answer stream in, stop one mid-way (the server must cancel it), thinking in a
// collapsible block, and stats per answer.
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
