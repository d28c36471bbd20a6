// The dsv4 chat page: sends the conversation to /v1/chat/completions with stream: true and
// reads the server-sent events through fetch + ReadableStream (EventSource cannot POST).
// Model text is only ever inserted as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const ui = {
  conversation: $("conversation"),
  empty: $("empty"),
  form: $("composer"),
  input: $("input"),
  send: $("send"),
  stop: $("stop"),
  think: $("think"),
  model: $("model"),
  status: $("status"),
  settings: $("settings"),
  settingsToggle: $("settings-toggle"),
  newChat: $("new-chat"),
  system: $("system"),
  temperature: $("temperature"),
  maxTokens: $("max-tokens"),
  apiKey: $("api-key"),
};

const state = {
  model: null,
  messages: [],        // the conversation as sent to the API (system prompt added per request)
  controller: null,    // AbortController of the answer being streamed
};

// ---- settings (kept in localStorage) ----------------------------------------------------------

const saved = ["system", "temperature", "maxTokens", "apiKey"];
for (const key of saved) {
  const value = localStorage.getItem("dsv4." + key);
  if (value !== null) ui[key].value = value;
  ui[key].addEventListener("change", () => localStorage.setItem("dsv4." + key, ui[key].value));
}
ui.think.checked = localStorage.getItem("dsv4.think") === "1";
ui.think.addEventListener("change", () => localStorage.setItem("dsv4.think", ui.think.checked ? "1" : "0"));
ui.settings.addEventListener("submit", (e) => e.preventDefault());
ui.settingsToggle.addEventListener("click", () => {
  ui.settings.hidden = !ui.settings.hidden;
  ui.settingsToggle.setAttribute("aria-expanded", String(!ui.settings.hidden));
});

function headers() {
  const h = { "Content-Type": "application/json" };
  if (ui.apiKey.value) h.Authorization = "Bearer " + ui.apiKey.value;
  return h;
}

// ---- server status ----------------------------------------------------------------------------

async function loadModel() {
  try {
    const res = await fetch("/v1/models", { headers: headers() });
    if (res.status === 401) {
      ui.model.textContent = "API key needed (Settings)";
      return;
    }
    const body = await res.json();
    state.model = body.data[0].id;
    ui.model.textContent = state.model;
  } catch {
    ui.model.textContent = "server unreachable";
  }
}

async function pollHealth() {
  try {
    const res = await fetch("/health");
    const h = await res.json();
    ui.status.className = "status " + (h.running || h.queue_depth > 0 ? "busy" : "ok");
    ui.status.title = h.running ? `generating, ${h.queue_depth} waiting` : "idle";
    if (!state.model) loadModel();
  } catch {
    ui.status.className = "status down";
    ui.status.title = "server unreachable";
  }
}

// ---- rendering --------------------------------------------------------------------------------

function element(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function scrollToEnd() {
  ui.conversation.scrollTop = ui.conversation.scrollHeight;
}

function addUserMessage(text) {
  ui.empty.hidden = true;
  const msg = element("div", "msg user");
  msg.append(element("div", "bubble", text));
  ui.conversation.append(msg);
  scrollToEnd();
}

// An assistant answer: an optional collapsible thinking block, the text, tool calls, stats.
function addAssistantMessage() {
  ui.empty.hidden = true;
  const msg = element("div", "msg assistant streaming");
  const thinking = element("details", "thinking");
  thinking.hidden = true;
  const summary = element("summary", "", "Thinking…");
  const reasoning = element("div", "reasoning");
  thinking.append(summary, reasoning);
  const bubble = element("div", "bubble");
  const tools = element("div", "tools");
  const stats = element("div", "stats");
  msg.append(thinking, bubble, tools, stats);
  ui.conversation.append(msg);
  scrollToEnd();
  return { msg, thinking, summary, reasoning, bubble, tools, stats };
}

function showError(view, text) {
  view.msg.append(element("div", "error", text));
  scrollToEnd();
}

function formatStats(s) {
  const parts = [];
  if (s.ttft !== null) parts.push(`TTFT ${s.ttft.toFixed(2)} s`);
  if (s.tokPerSec !== null) parts.push(`${s.tokPerSec.toFixed(1)} tok/s`);
  if (s.tokens !== null) parts.push(`${s.tokens} tokens`);
  if (s.cached) parts.push(`${s.cached} prompt tokens cached`);
  return parts.join(" · ");
}

// ---- one answer -------------------------------------------------------------------------------

async function send(text) {
  if (!state.model) await loadModel();
  if (!state.model) return;
  state.messages.push({ role: "user", content: text });
  addUserMessage(text);
  const view = addAssistantMessage();

  const messages = [];
  if (ui.system.value.trim()) messages.push({ role: "system", content: ui.system.value });
  messages.push(...state.messages);
  const body = {
    model: state.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: Math.max(1, parseInt(ui.maxTokens.value, 10) || 1024),
    temperature: Math.min(2, Math.max(0, parseFloat(ui.temperature.value) || 0)),
  };
  if (ui.think.checked) body.thinking = { type: "enabled" };

  const answer = { content: "", reasoning: "", toolCalls: [], finish: null };
  const stats = { ttft: null, tokPerSec: null, tokens: null, cached: null };
  const start = performance.now();
  let firstAt = null;
  let pieces = 0;
  let stopped = false;
  state.controller = new AbortController();
  setBusy(true);

  const onEvent = (data) => {
    if (data === "[DONE]") return;
    const event = JSON.parse(data);
    if (event.error) {
      showError(view, event.error.message);
      return;
    }
    if (event.usage) {
      stats.tokens = event.usage.completion_tokens;
      stats.cached = event.usage.prompt_tokens_details ? event.usage.prompt_tokens_details.cached_tokens : null;
    }
    if (event.stats && event.stats.decode_tok_s > 0) stats.tokPerSec = event.stats.decode_tok_s;
    const choice = event.choices && event.choices[0];
    if (!choice) return;
    const delta = choice.delta || {};
    if (delta.reasoning_content || delta.content) {
      if (firstAt === null) {
        firstAt = performance.now();
        stats.ttft = (firstAt - start) / 1000;
      }
      ++pieces;
    }
    if (delta.reasoning_content) {
      answer.reasoning += delta.reasoning_content;
      view.thinking.hidden = false;
      if (!answer.content) view.thinking.open = true;  // show the reasoning while it streams
      view.reasoning.textContent = answer.reasoning;
    }
    if (delta.content) {
      if (!answer.content && answer.reasoning) {
        view.thinking.open = false;  // the answer has started: fold the reasoning away
        view.summary.textContent = "Thought";
      }
      answer.content += delta.content;
      view.bubble.textContent = answer.content;
    }
    for (const call of delta.tool_calls || []) {
      answer.toolCalls.push(call);
      view.tools.append(element("div", "tool-call", `${call.function.name}(${call.function.arguments})`));
    }
    if (choice.finish_reason) answer.finish = choice.finish_reason;
    scrollToEnd();
  };

  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
    if (!res.ok) {
      const err = await res.json().catch(() => null);
      showError(view, err && err.error ? err.error.message : `HTTP ${res.status}`);
      state.messages.pop();
      return;
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) if (line.startsWith("data: ")) onEvent(line.slice(6));
      }
    }
  } catch (e) {
    if (e.name === "AbortError") stopped = true;
    else showError(view, "The connection failed: " + e.message);
  } finally {
    state.controller = null;
    setBusy(false);
    view.msg.classList.remove("streaming");
    if (answer.reasoning && !answer.content) view.summary.textContent = stopped ? "Thinking (stopped)" : "Thought";
    if (stats.tokens === null && pieces) stats.tokens = pieces;  // stopped early: no usage came
    if (stats.tokPerSec === null && firstAt !== null && pieces > 1)
      stats.tokPerSec = (pieces - 1) / ((performance.now() - firstAt) / 1000);
    view.stats.textContent = formatStats(stats);
    if (!answer.content && (answer.reasoning || answer.toolCalls.length)) view.bubble.hidden = true;
    if (stopped) view.stats.append(element("span", "stopped", (view.stats.textContent ? " · " : "") + "stopped"));
    else if (answer.finish === "length") view.stats.append(element("span", "", " · hit the token limit"));
  }
  // Keep what was said (even an answer cut short) so the next turn continues it.
  const reply = { role: "assistant", content: answer.content };
  if (answer.toolCalls.length) reply.tool_calls = answer.toolCalls.map(({ id, type, function: f }) => ({ id, type, function: f }));
  state.messages.push(reply);
}

function setBusy(busy) {
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
  ui.input.disabled = busy;
  if (!busy) ui.input.focus();
}

// ---- wiring -----------------------------------------------------------------------------------

ui.form.addEventListener("submit", (e) => {
  e.preventDefault();
  const text = ui.input.value.trim();
  if (!text || state.controller) return;
  ui.input.value = "";
  autosize();
  send(text);
});
ui.input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    ui.form.requestSubmit();
  }
});
function autosize() {
  ui.input.style.height = "auto";
  ui.input.style.height = ui.input.scrollHeight + "px";
}
ui.input.addEventListener("input", autosize);
ui.stop.addEventListener("click", () => {
  if (state.controller) state.controller.abort();  // the server notices and cancels
});
ui.newChat.addEventListener("click", () => {
  if (state.controller) state.controller.abort();
  state.messages = [];
  for (const m of ui.conversation.querySelectorAll(".msg")) m.remove();
  ui.empty.hidden = false;
  ui.input.focus();
});

loadModel();
pollHealth();
setInterval(pollHealth, 5000);
ui.input.focus();
