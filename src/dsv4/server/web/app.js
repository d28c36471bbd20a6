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
  notice: $("notice"),
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
function showSettings(show) {
  ui.settings.hidden = !show;
  ui.settingsToggle.setAttribute("aria-expanded", String(show));
}
ui.settingsToggle.addEventListener("click", () => showSettings(ui.settings.hidden));
ui.apiKey.addEventListener("change", () => loadModel());

// Numeric settings are sent exactly as typed: a value the API would refuse is marked invalid
// beside its field and stops the send; it is never clamped or replaced by a default.
const numeric = [
  { input: ui.temperature, error: $("temperature-error"), label: "Temperature", rule: "a number from 0 to 2",
    integer: false, min: 0, max: 2 },
  { input: ui.maxTokens, error: $("max-tokens-error"), label: "Max tokens", rule: "a whole number of at least 1",
    integer: true, min: 1, max: Infinity },
];

// The setting's value, or null after marking the field invalid (its reason shown beside it).
function checkSetting(s) {
  const raw = s.input.value.trim();  // "" too when the browser could not read a number
  const x = Number(raw);
  const ok = raw !== "" && !s.input.validity.badInput && Number.isFinite(x) && (!s.integer || Number.isInteger(x)) &&
             x >= s.min && x <= s.max;
  s.input.setAttribute("aria-invalid", String(!ok));
  s.error.textContent = ok ? "" : `${s.label} must be ${s.rule}${raw ? `, not ${raw}` : ""}.`;
  s.error.hidden = ok;
  return ok ? x : null;
}
for (const s of numeric) {
  s.input.addEventListener("input", () => checkSetting(s));
  checkSetting(s);  // a stored value may be out of range
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (ui.apiKey.value) h.Authorization = "Bearer " + ui.apiKey.value;
  return h;
}

// ---- server status ----------------------------------------------------------------------------

const unreachable = (e) => `the server is unreachable (${e.message}).`;

// Why the server refused a request: its error JSON's message when it sent one.
async function refusal(res) {
  if (res.status === 401 && !ui.apiKey.value) return "this server needs an API key: enter it in Settings.";
  const body = await res.json().catch(() => null);
  const message = body && body.error && body.error.message;
  return message ? `${message} (HTTP ${res.status})` : `HTTP ${res.status} ${res.statusText}`.trim() + ".";
}

// Asks the server for its model; returns why that failed, "" when it worked.
async function loadModel() {
  let res;
  try {
    res = await fetch("/v1/models", { headers: headers() });
  } catch (e) {
    ui.model.textContent = "server unreachable";
    return unreachable(e);
  }
  if (!res.ok) {
    ui.model.textContent = res.status === 401 ? "API key needed (Settings)" : `HTTP ${res.status}`;
    return refusal(res);
  }
  const body = await res.json().catch(() => null);
  const id = body && Array.isArray(body.data) && body.data[0] && body.data[0].id;
  if (typeof id !== "string") {
    ui.model.textContent = "no model";
    return "the server named no model in /v1/models.";
  }
  state.model = id;
  ui.model.textContent = id;
  return "";
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

// Why the typed message was not sent; the text stays in the input for another try.
function notSent(why) {
  ui.notice.textContent = "Not sent: " + why;
  ui.notice.hidden = false;
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

// Posts the conversation plus `text`; returns the streaming response once the server accepted
// it, or null after saying why not.
async function post(text, temperature, maxTokens) {
  if (!state.model) {
    const why = await loadModel();
    if (why) {
      notSent(why);
      return null;
    }
  }
  const messages = [];
  if (ui.system.value.trim()) messages.push({ role: "system", content: ui.system.value });
  messages.push(...state.messages, { role: "user", content: text });
  const body = {
    model: state.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: maxTokens,
    temperature,
  };
  if (ui.think.checked) body.thinking = { type: "enabled" };
  let res;
  try {
    res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
  } catch (e) {
    notSent(e.name === "AbortError" ? "stopped before the server answered." : unreachable(e));
    return null;
  }
  if (!res.ok) {
    notSent(await refusal(res));
    return null;
  }
  return res;
}

async function send(text) {
  ui.notice.hidden = true;
  const [temperature, maxTokens] = numeric.map(checkSetting);
  if (temperature === null || maxTokens === null) {
    showSettings(true);
    notSent(numeric.map((s) => s.error.textContent).filter(Boolean).join(" "));
    return;
  }
  state.controller = new AbortController();
  setBusy(true);
  const start = performance.now();
  const res = await post(text, temperature, maxTokens);
  if (!res) {
    state.controller = null;
    setBusy(false);
    return;
  }
  // Accepted: the message joins the conversation and leaves the input.
  ui.input.value = "";
  autosize();
  state.messages.push({ role: "user", content: text });
  addUserMessage(text);
  const view = addAssistantMessage();

  const answer = { content: "", reasoning: "", toolCalls: [], finish: null };
  const stats = { ttft: null, tokPerSec: null, tokens: null, cached: null };
  let firstAt = null;
  let pieces = 0;
  let stopped = false;

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
  send(text);  // clears the input only once the server has accepted the message
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
